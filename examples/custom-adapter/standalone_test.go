package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The example is what an adapter's author writes outside this module:
// copied into a module of its own that requires fencegate (replaced by
// this checkout), it builds and its tests compile (go vet), so it uses
// only fencegate's public packages — Go refuses an internal one from
// another module.
func TestBuildsOutsideTheModule(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	fencegateMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(files) < 2 {
		t.Fatalf("copied %d Go files of the example, want its program and its tests", len(files))
	}
	// fencegate's own requirements, pinned: the copy's module graph is
	// fencegate's, resolved from the local module cache without a proxy.
	_, requires, ok := strings.Cut(string(fencegateMod), "\nrequire")
	if !ok {
		t.Fatal("fencegate's go.mod has no require block")
	}
	goMod := "module example.com/notify\n\ngo 1.26.0\n\n" +
		"require github.com/fencegate/fencegate v0.0.0\n\n" +
		"replace github.com/fencegate/fencegate => " + root + "\n\nrequire" + requires
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"build", "-o", os.DevNull, "."}, {"vet", "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod -buildvcs=false", "GOPROXY=off", "GOWORK=off")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("go %s in a copy outside the module (%d files): %v\n%s", strings.Join(args, " "), len(files), err, out.String())
		}
	}
	t.Logf("%d files of the example build and vet as a module of their own", len(files))
}
