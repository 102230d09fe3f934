package file

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
	if got := fi.Mode().Perm(); got != 0o640 {
		t.Errorf("published mode %v, want 0640 exactly (the umask does not apply)", got)
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

// The allow-list is matched on the path a target resolves to, symbolic
// links of existing directories under the root followed: a directory
// inside an allowed tree that links to a tree the list does not allow (in
// the root or out of it), or to a dotfile directory, does not let a
// target through. Refused at execute, permanently, naming payload.target,
// and nothing is written where the link leads; a link from one allowed
// tree into another is followed.
func TestAllowMatchesResolvedPath(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Allow = []string{"public/**", "shared/**"} })
	outside := t.TempDir()
	for _, d := range []string{"public", "private", "shared/real", ".hidden"} {
		if err := os.MkdirAll(filepath.Join(b.root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, to := range map[string]string{
		"public/leak":      filepath.Join(b.root, "private"), // absolute, in the root
		"public/rel":       "../private",                     // relative, in the root
		"public/nested":    "leak",                           // a link to a link
		"public/dot":       "../.hidden",                     // a dotfile directory
		"public/out":       outside,                          // out of the root
		"public/to-shared": "../shared/real",                 // another allowed tree
	} {
		if err := os.Symlink(to, filepath.Join(b.root, link)); err != nil {
			t.Fatal(err)
		}
	}
	spec := b.a.KindSpec()
	for _, tc := range []struct {
		target   string
		sentinel error
	}{
		{"public/leak/x.txt", ErrNotAllowed},
		{"public/rel/x.txt", ErrNotAllowed},
		{"public/nested/x.txt", ErrNotAllowed},
		{"public/leak/new/dir/x.txt", ErrNotAllowed},
		{"public/dot/x.txt", ErrNotAllowed},
		{"public/out/x.txt", ErrOutsideRoot},
	} {
		raw, _ := json.Marshal(map[string]string{"target": tc.target, "content": "pwned"})
		// The logical path is allowed: only the destination can tell.
		if err := spec.Check(raw); err != nil {
			t.Fatalf("enqueue %s: %v", tc.target, err)
		}
		_, err := b.a.Execute(context.Background(), request(tc.target, 1, 1, "k-"+tc.target, "pwned"))
		if !adapters.IsPermanent(err) || !errors.Is(err, tc.sentinel) || !strings.Contains(err.Error(), "payload.target") {
			t.Errorf("execute %s: %v, want permanent %v naming payload.target", tc.target, err, tc.sentinel)
		}
	}
	if n := b.writes.Load(); n != 0 {
		t.Errorf("%d content writes for refused targets", n)
	}
	for _, d := range []string{filepath.Join(b.root, "private"), filepath.Join(b.root, ".hidden"), outside} {
		if got := listDir(t, d); len(got) != 0 {
			t.Errorf("%s holds %q after refused targets, want nothing", d, got)
		}
	}
	r := result(t, execute(t, b.a, request("public/to-shared/x.txt", 1, 1, "k-shared", "fine")))
	if got := readFile(t, filepath.Join(b.root, "shared/real/x.txt")); got != "fine" || r.Path != "public/to-shared/x.txt" {
		t.Errorf("through a link between allowed trees: content %q, result %+v", got, r)
	}
	t.Logf("%d refused, 1 published through a link", 6)
}

// A directory swapped for a symbolic link between the checks of a
// target's path and the opening of its directory is not followed: the
// directory written in is the one the checks judged, or none (a
// retryable error: the next attempt judges where the link leads, and
// refuses it for good).
func TestLinkSwappedAfterTheChecksIsNotFollowed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, target, swap string }{
		{"existing directory", "public/x.txt", "public"},
		{"deeper directory", "public/a/x.txt", "public/a"},
		{"created directory", "public/new/x.txt", "public/new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *Config) { c.Allow = []string{"public/**"} })
			for _, d := range []string{"public/a", "private"} {
				if err := os.MkdirAll(filepath.Join(b.root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			swapped := 0
			b.a.afterResolve = func() {
				if swapped++; swapped > 1 {
					t.Error("the refused attempt opened the directory")
					return
				}
				p := filepath.Join(b.root, tc.swap)
				if err := os.Rename(p, p+".old"); err != nil && !errors.Is(err, fs.ErrNotExist) {
					t.Error(err)
				}
				// Relative: os.Root follows it, staying in the root.
				to, err := filepath.Rel(filepath.Dir(p), filepath.Join(b.root, "private"))
				if err == nil {
					err = os.Symlink(to, p)
				}
				if err != nil {
					t.Error(err)
				}
			}
			_, err := b.a.Execute(context.Background(), request(tc.target, 1, 1, "k", "pwned"))
			if !adapters.IsRetryable(err) {
				t.Errorf("execute with %s swapped for a link: %v, want retryable", tc.swap, err)
			}
			if got := listDir(t, filepath.Join(b.root, "private")); len(got) != 0 {
				t.Errorf("private holds %q, want nothing", got)
			}
			// The next attempt sees the link and refuses it for good.
			_, err = b.a.Execute(context.Background(), request(tc.target, 1, 1, "k", "pwned"))
			if !adapters.IsPermanent(err) || !errors.Is(err, ErrNotAllowed) {
				t.Errorf("the next attempt: %v, want permanent ErrNotAllowed", err)
			}
			if n := b.writes.Load(); n != 0 || swapped != 1 {
				t.Errorf("%d content writes, %d swaps; want 0 and 1", n, swapped)
			}
		})
	}
}
