// Package layercheck holds a test that keeps the module's import layers:
// runtime code never reaches a test kit or a tool, the core never reaches
// the packages built on it, internal packages never reach back up, and an
// example uses public packages only, so that it builds when copied out of
// the module.
//
// The layers, bottom up:
//
//	fenceerr, internal/* (runtime internals)
//	kinds/*                 a kind's payload rules (fenceerr, internal/kindcheck)
//	outbox, lease, idempotency, dispatcher, migrations, policy   the core
//	adapters/..., executor, operator, shard, admin, gateway, cli, cmd
//
// beside them internal/testkit/* and adapters/adaptertest (test kits),
// cli/internal/* (the tools the binary ships: bench, dev), test/* (the
// fault tests) and examples/*.
package layercheck

import (
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The module checked; -layercheck.root checks another checkout (a branch
// before a move, say) with the same rules.
var rootFlag = flag.String("layercheck.root", "../..", "root of the module whose imports are checked")

// core are the packages the rest is built on.
var core = []string{"outbox", "lease", "idempotency", "dispatcher", "migrations", "policy", "fenceerr"}

// above are the packages built on the core: neither the core nor an
// internal package imports them.
var above = []string{"adapters", "executor", "admin", "gateway", "cli", "operator", "shard", "cmd", "examples", "test"}

// internalUp lists the internal runtime packages allowed to import a core
// package, and why; any other internal runtime package imports only
// internal runtime packages and fenceerr.
var internalUp = map[string]string{
	// The one table from the core's errors to HTTP statuses and exit
	// codes, for admin, gateway and cli: it names lease's and outbox's
	// error types.
	"internal/errmap": "maps core errors to statuses",
}

// A file is one parsed Go file: its directory relative to the root, and
// the module's packages it imports, relative to the module path.
type file struct {
	path    string // relative, slash-separated
	dir     string
	test    bool
	imports []string
}

// role names a directory's place in the layout.
func role(dir string) string {
	switch {
	case under(dir, "internal/testkit"), dir == "adapters/adaptertest":
		return "testkit"
	case under(dir, "cli/internal"):
		return "tool"
	case under(dir, "test"):
		return "test"
	case under(dir, "examples"):
		return "example"
	case slices.Contains(core, dir):
		return "core"
	case under(dir, "kinds"):
		return "kind"
	case under(dir, "internal"):
		return "internal"
	}
	return "public"
}

// under reports whether dir is p or below it.
func under(dir, p string) bool { return dir == p || strings.HasPrefix(dir, p+"/") }

func underAny(dir string, ps []string) bool {
	return slices.ContainsFunc(ps, func(p string) bool { return under(dir, p) })
}

// rule is one layer rule: applies says which files it reads, check which
// of their imports break it.
type rule struct {
	name    string
	applies func(f file) bool
	check   func(f file, imp string) bool // true: a violation
}

var rules = []rule{
	{
		// What ships in the binary is built from runtime code only; the
		// tools ship too, but only package cli starts them. A tool may use
		// a test kit (gateway dev starts a throwaway PostgreSQL cluster with
		// internal/testkit/pgcluster).
		name: "runtime code imports a test kit or a tool",
		applies: func(f file) bool {
			r := role(f.dir)
			return !f.test && r != "testkit" && r != "tool" && r != "test"
		},
		check: func(f file, imp string) bool {
			switch {
			case role(imp) == "testkit", role(imp) == "test":
				return true
			case role(imp) == "tool":
				return f.dir != "cli"
			}
			return false
		},
	},
	{
		// Tests included: a test that needs an adapter or the gateway
		// belongs to the package built on the core, or to test/.
		name:    "a core package imports a package built on the core",
		applies: func(f file) bool { return role(f.dir) == "core" },
		check:   func(f file, imp string) bool { return underAny(imp, above) },
	},
	{
		// Tests included: an example is copied out of the module whole.
		name:    "an example imports an internal package",
		applies: func(f file) bool { return role(f.dir) == "example" },
		check: func(f file, imp string) bool {
			return under(imp, "internal") || strings.Contains(imp, "/internal/") || strings.HasSuffix(imp, "/internal")
		},
	},
	{
		name: "an internal package imports back up the layers",
		applies: func(f file) bool {
			r := role(f.dir)
			return !f.test && (r == "internal" || r == "testkit" && f.dir != "adapters/adaptertest")
		},
		check: func(f file, imp string) bool {
			switch {
			case underAny(imp, above):
				return true
			case role(f.dir) == "testkit":
				return false // the core's packages, migrations to set up a database
			case role(imp) == "internal", imp == "fenceerr":
				return false
			}
			return internalUp[f.dir] == "" || role(imp) != "core"
		},
	},
	{
		// The core imports the kinds: they import nothing above them (s3's
		// rules use file's).
		name:    "a kind's rule package imports more than fenceerr, internal runtime and kinds",
		applies: func(f file) bool { return !f.test && role(f.dir) == "kind" },
		check: func(f file, imp string) bool {
			return imp != "fenceerr" && role(imp) != "internal" && role(imp) != "kind"
		},
	},
}

// parseTree reads every Go file under root (build tags ignored: a file
// behind a tag ships in some build) and returns the module's imports of
// each.
func parseTree(root string) (string, []file, error) {
	mod, err := modulePath(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", nil, err
	}
	fset := token.NewFileSet()
	var files []file
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "var" || name == "node_modules" || name == "vendor") {
				return filepath.SkipDir
			}
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		af, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		f := file{path: rel, dir: filepath.ToSlash(filepath.Dir(rel)), test: strings.HasSuffix(rel, "_test.go")}
		for _, spec := range af.Imports {
			p, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			if p == mod {
				f.imports = append(f.imports, ".")
			} else if rest, ok := strings.CutPrefix(p, mod+"/"); ok {
				f.imports = append(f.imports, rest)
			}
		}
		files = append(files, f)
		return nil
	})
	return mod, files, err
}

func modulePath(goMod string) (string, error) {
	b, err := os.ReadFile(goMod)
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", fmt.Errorf("%s: no module line", goMod)
}

// counts is what one rule read.
type counts struct{ files, imports int }

// check applies every rule to files and returns the violations, one line
// each, and what each rule read.
func check(files []file) ([]string, map[string]counts) {
	var bad []string
	read := map[string]counts{}
	for _, r := range rules {
		c := counts{}
		for _, f := range files {
			if !r.applies(f) {
				continue
			}
			c.files++
			for _, imp := range f.imports {
				c.imports++
				if r.check(f, imp) {
					bad = append(bad, fmt.Sprintf("%s imports %s: %s", f.path, imp, r.name))
				}
			}
		}
		read[r.name] = c
	}
	return bad, read
}

func TestImportLayers(t *testing.T) {
	mod, files, err := parseTree(*rootFlag)
	if err != nil {
		t.Fatal(err)
	}
	bad, read := check(files)
	imports := 0
	for _, f := range files {
		imports += len(f.imports)
	}
	t.Logf("%d Go files of %s, %d imports of its own packages", len(files), mod, imports)
	for _, r := range rules {
		c := read[r.name]
		t.Logf("rule %q: %d files, %d imports", r.name, c.files, c.imports)
		// A rule that read nothing checks nothing: a directory renamed
		// under it would pass silently.
		if c.files == 0 || c.imports == 0 {
			t.Errorf("rule %q read %d files and %d imports: its directories have moved", r.name, c.files, c.imports)
		}
	}
	for _, b := range bad {
		t.Error(b)
	}
	t.Logf("%d violations", len(bad))
}

// Each rule catches its violation in a tree written for the purpose, and
// passes the imports the layout allows.
func TestRulesCatchViolations(t *testing.T) {
	const mod = "example.com/m"
	tree := map[string]string{
		"go.mod": "module " + mod + "\n",
		// Allowed.
		"cli/cli.go":                     imports("cli", "cli/internal/bench", "gateway", "internal/errmap"),
		"cli/internal/bench/bench.go":    imports("bench", "internal/testkit/pgcluster", "adapters/file"),
		"internal/errmap/errmap.go":      imports("errmap", "lease", "outbox", "fenceerr"),
		"internal/testkit/testdb/db.go":  imports("testdb", "migrations", "internal/testkit/pgcluster"),
		"adapters/adaptertest/env.go":    imports("adaptertest", "internal/testkit/testdb", "adapters"),
		"outbox/outbox.go":               imports("outbox", "kinds/emailkind", "internal/intents"),
		"outbox/outbox_test.go":          imports("outbox_test", "internal/testkit/testdb", "lease"),
		"kinds/emailkind/emailkind.go":   imports("emailkind", "fenceerr", "internal/kindcheck"),
		"kinds/s3kind/s3kind.go":         imports("s3kind", "kinds/filekind"),
		"examples/w/main.go":             imports("main", "outbox", "lease"),
		"examples/w/main_test.go":        imports("main", "adapters/adaptertest"),
		"gateway/gateway_test.go":        imports("gateway", "internal/testkit/natstest"),
		"test/chaos/chaos_test.go":       imports("chaos", "test/chaos/internal/chaos", "internal/testkit/testdb"),
		"test/chaos/internal/chaos/m.go": imports("chaos", "adapters/email", "outbox"),
		// One violation each.
		"gateway/gateway.go":           imports("gateway", "internal/testkit/natstest"),
		"admin/admin.go":               imports("admin", "cli/internal/devenv"),
		"shard/shard.go":               imports("shard", "adapters/adaptertest"),
		"lease/lease.go":               imports("lease", "admin"),
		"dispatcher/d_test.go":         imports("dispatcher", "adapters/file"),
		"migrations/m.go":              imports("migrations", "adapters/email/emailkind"),
		"examples/x/main.go":           imports("main", "internal/wire"),
		"examples/x/x_test.go":         imports("main", "internal/testkit/testdb"),
		"internal/group/group.go":      imports("group", "outbox"),
		"internal/testkit/s3test/s.go": imports("s3test", "gateway"),
		"kinds/filekind/filekind.go":   imports("filekind", "outbox"),
	}
	root := t.TempDir()
	for name, src := range tree {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if name != "go.mod" {
			src = strings.ReplaceAll(src, "MOD/", mod+"/")
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, files, err := parseTree(root)
	if err != nil {
		t.Fatal(err)
	}
	bad, _ := check(files)
	want := []string{
		"admin/admin.go imports cli/internal/devenv: runtime code imports a test kit or a tool",
		"dispatcher/d_test.go imports adapters/file: a core package imports a package built on the core",
		"examples/x/main.go imports internal/wire: an example imports an internal package",
		"examples/x/x_test.go imports internal/testkit/testdb: an example imports an internal package",
		"gateway/gateway.go imports internal/testkit/natstest: runtime code imports a test kit or a tool",
		"internal/group/group.go imports outbox: an internal package imports back up the layers",
		"internal/testkit/s3test/s.go imports gateway: an internal package imports back up the layers",
		"kinds/filekind/filekind.go imports outbox: a kind's rule package imports more than fenceerr, internal runtime and kinds",
		"lease/lease.go imports admin: a core package imports a package built on the core",
		"migrations/m.go imports adapters/email/emailkind: a core package imports a package built on the core",
		"shard/shard.go imports adapters/adaptertest: runtime code imports a test kit or a tool",
	}
	slices.Sort(bad)
	if !slices.Equal(bad, want) {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(bad, "\n"), strings.Join(want, "\n"))
	}
	t.Logf("%d files in the specimen tree, %d violations found", len(files), len(bad))
}

// imports is a Go file of package pkg importing the module's packages ps.
func imports(pkg string, ps ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "package %s\n\nimport (\n", pkg)
	for _, p := range ps {
		fmt.Fprintf(&b, "\t_ %q\n", "MOD/"+p)
	}
	b.WriteString(")\n")
	return b.String()
}
