package file

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/fenceerr"
)

// The target policy: only allowed targets, no dotfiles unless allowed, at
// most MaxBytes; refused at enqueue (the gateway's KindSpec, naming the
// field) and at execute (permanent, nothing written). Published files get
// FileMode.
func TestTargetPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.Allow = []string{"reports/**", "exports/*.csv"}
		c.MaxBytes = 10
		c.FileMode = 0o640
	})
	spec := b.a.KindSpec()
	for _, tc := range []struct {
		target, content, field string
	}{
		{"other/x.txt", "x", "payload.target"},
		{"exports/a/b.csv", "x", "payload.target"},
		{"exports/x.txt", "x", "payload.target"},
		{"reports/.hidden", "x", "payload.target"},
		{".profile", "x", "payload.target"},
		{"reports/big.txt", "01234567890", "payload.content"},
	} {
		raw, _ := json.Marshal(map[string]string{"target": tc.target, "content": tc.content})
		var inv *fenceerr.InvalidError
		if err := spec.Check(raw); !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("enqueue %s: %v, want an InvalidError naming %s", tc.target, err, tc.field)
		}
		_, err := b.a.Execute(context.Background(), request(tc.target, 1, 1, "k-"+tc.target, tc.content))
		if !adapters.IsPermanent(err) || !errors.Is(err, ErrNotAllowed) {
			t.Errorf("execute %s: %v, want permanent ErrNotAllowed", tc.target, err)
		}
	}
	if n := b.writes.Load(); n != 0 {
		t.Errorf("%d content writes for refused targets", n)
	}
	for _, ok := range []string{"reports/2026/12/01.txt", "exports/a.csv"} {
		if _, err := b.a.Execute(context.Background(), request(ok, 1, 1, "k-"+ok, "fine")); err != nil {
			t.Errorf("execute %s: %v", ok, err)
		}
	}
	fi, err := os.Stat(filepath.Join(b.root, "exports", "a.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got&^0o640 != 0 || got&0o600 != 0o600 {
		t.Errorf("published mode %v, want 0640 (less the umask)", got)
	}
	// Dotfiles when allowed.
	d := setup(t, func(c *Config) { c.AllowDotfiles = true })
	if _, err := d.a.Execute(context.Background(), request("conf/.env.example", 1, 1, "k-dot", "x")); err != nil {
		t.Errorf("a dotfile with AllowDotfiles: %v", err)
	}
	if _, err := New(Config{Root: t.TempDir(), Allow: []string{"[bad"}}); err == nil {
		t.Error("a bad pattern was accepted")
	}
}
