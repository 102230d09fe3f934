package file

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fencegate/fencegate/adapters"
)

// Before its commit point (the rename into place) the adapter re-validates
// that its attempt still owns the key. When it does not, nothing is
// published, the error says nothing happened (retryable), and Lookup finds
// nothing; the next owner publishes normally.
func TestStillOwnerCheckedBeforeRename(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lost := request("report.txt", 3, 1, "k1", "content\n").WithOwnerCheck(func(context.Context) error {
		return errors.New("key taken over")
	})
	_, err := b.a.Execute(context.Background(), lost)
	if err == nil || !adapters.IsRetryable(err) || adapters.IsUnknown(err) || !errors.Is(err, adapters.ErrNotOwner) {
		t.Fatalf("Execute after losing the key: %v; want a retryable ErrNotOwner", err)
	}
	if _, err := os.Stat(filepath.Join(b.root, "report.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("target after the refused publication: %v; want none", err)
	}
	if _, found := lookup(t, b.a, request("report.txt", 3, 1, "k1", "content\n")); found {
		t.Fatal("Lookup found a publication that never happened")
	}
	out := execute(t, b.a, request("report.txt", 3, 2, "k1", "content\n").WithOwnerCheck(func(context.Context) error { return nil }))
	if got, err := os.ReadFile(filepath.Join(b.root, "report.txt")); err != nil || string(got) != "content\n" {
		t.Fatalf("after the owner's publication: %q, %v (outcome %s)", got, err, out.Result)
	}
}
