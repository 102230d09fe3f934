package migrations_test

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/migrations"
)

// lastWithoutFunctionFiles is the newest versioned migration of the builds
// that kept the functions in versioned migrations only: a database they
// migrated has every function as its highest-numbered migration left it.
const lastWithoutFunctionFiles = 21

// catalog is what a schema's functions are, by signature: the definition
// (pg_get_functiondef: body, language, volatility, SECURITY DEFINER, SET
// clauses), the owner and the grants; and the triggers calling them.
func catalog(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `
		SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
		       pg_get_functiondef(p.oid)
		       || E'\nconfig: ' || coalesce(array_to_string(p.proconfig, '; '), '')
		       || E'\nsecurity definer: ' || p.prosecdef
		       || E'\nowner: ' || pg_get_userbyid(p.proowner)
		       || E'\nacl: ' || coalesce(p.proacl::text, '(default)')
		FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
		UNION ALL
		SELECT 'trigger ' || tg.tgname || ' on ' || c.relname, pg_get_triggerdef(tg.oid)
		FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
		WHERE c.relnamespace = $1::regnamespace AND NOT tg.tgisinternal`, testdb.Schema())
	if err != nil {
		t.Fatal(err)
	}
	type entry struct{ Key, Def string }
	entries, err := pgx.CollectRows(rows, pgx.RowToStructByPos[entry])
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]string, len(entries))
	for _, e := range entries {
		m[e.Key] = e.Def
	}
	return m
}

// differences lists what differs between two catalogs, one line each; for
// a definition that differs, its first differing line.
func differences(a, b map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		w, ok := b[k]
		switch {
		case !ok:
			out = append(out, k+": only in the first")
		case w != a[k]:
			al, bl := strings.Split(a[k], "\n"), strings.Split(w, "\n")
			i := 0
			for i < len(al) && i < len(bl) && al[i] == bl[i] {
				i++
			}
			line := func(l []string) string {
				if i < len(l) {
					return strings.TrimSpace(l[i])
				}
				return "(end)"
			}
			out = append(out, fmt.Sprintf("%s: line %d: %q vs %q", k, i+1, line(al), line(bl)))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if _, ok := a[k]; !ok {
			out = append(out, k+": only in the second")
		}
	}
	return out
}

// editedFunctions is the function files with fencegate_enqueue's body
// changed the way a developer changes it: in its file, with no versioned
// migration.
func editedFunctions(t *testing.T) (fs.FS, string) {
	t.Helper()
	const marker = "-- edited in its file only"
	sub, err := fs.Sub(migrations.FS(), migrations.FunctionsDir)
	if err != nil {
		t.Fatal(err)
	}
	edited := fstest.MapFS{}
	names, err := fs.Glob(sub, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		b, err := fs.ReadFile(sub, n)
		if err != nil {
			t.Fatal(err)
		}
		if n == "enqueue.sql" {
			before := string(b)
			b = []byte(strings.Replace(before, "    outcome := 'inserted';\n", "    outcome := 'inserted'; "+marker+"\n", 1))
			if string(b) == before {
				t.Fatal("enqueue.sql: the line to edit is not there")
			}
		}
		edited[n] = &fstest.MapFile{Data: b}
	}
	return edited, marker
}

// A fresh install and databases upgraded from what older builds left
// (versioned migrations only, up to several versions) end with the same
// functions, definitions, settings, owners and grants, and the same
// triggers. And a function edited in its file only reaches a fresh
// install, one upgraded from an older build and one already current,
// alike; the comparison sees that edit (it is not blind to a changed
// function).
func TestFunctionsFreshEqualsUpgraded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema()

	fresh := emptyDatabase(t)
	if _, err := migrations.Up(ctx, fresh, migrations.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	want := catalog(t, fresh)
	fns := 0
	for k := range want {
		if strings.HasPrefix(k, "function ") {
			fns++
		}
	}
	t.Logf("fresh install: %d functions, %d triggers", fns, len(want)-fns)
	if fns == 0 {
		t.Fatal("no functions in the fresh install")
	}

	for _, from := range []int64{19, 20, lastWithoutFunctionFiles} {
		pool := emptyDatabase(t)
		if err := migrations.UpVersioned(ctx, pool, schema, from); err != nil {
			t.Fatal(err)
		}
		if _, err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
			t.Fatal(err)
		}
		if d := differences(want, catalog(t, pool)); len(d) > 0 {
			t.Errorf("upgraded from version %d differs from a fresh install in %d:\n  %s", from, len(d), strings.Join(d, "\n  "))
		} else {
			t.Logf("upgraded from version %d: the same %d functions and triggers", from, len(want))
		}
	}

	edited, marker := editedFunctions(t)
	cfg := migrations.WithFunctions(migrations.Config{Schema: schema}, edited)
	freshEdited := emptyDatabase(t)
	if _, err := migrations.Up(ctx, freshEdited, cfg); err != nil {
		t.Fatal(err)
	}
	wantEdited := catalog(t, freshEdited)
	if d := differences(want, wantEdited); len(d) != 1 || !strings.HasPrefix(d[0], "function fencegate_enqueue(") {
		t.Fatalf("the edited enqueue.sql changed %d things: %q; want fencegate_enqueue alone", len(d), d)
	}
	if !strings.Contains(wantEdited["function fencegate_enqueue(p_resource text, p_epoch bigint, p_operation text, p_kind text, p_key text, p_fence text, p_payload jsonb, p_notify boolean, OUT outcome text, OUT intent_id bigint, OUT status text, OUT current_epoch bigint, OUT existing_epoch bigint)"], marker) {
		t.Fatalf("the fresh install's fencegate_enqueue lacks the edit %q", marker)
	}
	upgrades := map[string]func(*pgxpool.Pool) error{
		"from an older build": func(pool *pgxpool.Pool) error {
			return migrations.UpVersioned(ctx, pool, schema, lastWithoutFunctionFiles)
		},
		"from the current files": func(pool *pgxpool.Pool) error {
			_, err := migrations.Up(ctx, pool, migrations.Config{Schema: schema})
			return err
		},
	}
	for _, name := range slices.Sorted(maps.Keys(upgrades)) {
		pool := emptyDatabase(t)
		if err := upgrades[name](pool); err != nil {
			t.Fatal(err)
		}
		if _, err := migrations.Up(ctx, pool, cfg); err != nil {
			t.Fatal(err)
		}
		if d := differences(wantEdited, catalog(t, pool)); len(d) > 0 {
			t.Errorf("with the edited enqueue.sql, upgraded %s differs from a fresh install in %d:\n  %s", name, len(d), strings.Join(d, "\n  "))
		} else {
			t.Logf("with the edited enqueue.sql, upgraded %s: the same %d functions and triggers", name, len(wantEdited))
		}
	}
}

var (
	createFunctionRE = regexp.MustCompile(`(?im)^\s*CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(?:fencegate\.)?(\w+)\s*\(`)
	versionRE        = regexp.MustCompile(`^(\d+)_.*\.sql$`)
)

// Each function of the schema has its one current definition in one
// function file, and no versioned migration after the last one of the
// builds without function files defines a function (a new one drops a
// function whose signature changes; its new definition goes in its file).
func TestFunctionFiles(t *testing.T) {
	t.Parallel()
	files := migrations.FS()
	names, err := fs.Glob(files, migrations.FunctionsDir+"/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	definedIn := map[string][]string{}
	for _, n := range names {
		b, err := fs.ReadFile(files, n)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range createFunctionRE.FindAllStringSubmatch(string(b), -1) {
			definedIn[m[1]] = append(definedIn[m[1]], n)
		}
	}
	t.Logf("%d function files define %d functions", len(names), len(definedIn))
	if len(definedIn) == 0 {
		t.Fatal("no function defined in the function files")
	}
	installed := testdb.Strings(t, testdb.New(t), `SELECT p.proname FROM pg_proc p WHERE p.pronamespace = $1::regnamespace`, testdb.Schema())
	for _, f := range installed {
		if len(definedIn[f]) != 1 {
			t.Errorf("function %s is defined in %d function files %q; want exactly one", f, len(definedIn[f]), definedIn[f])
		}
	}
	for f := range definedIn {
		if !slices.Contains(installed, f) {
			t.Errorf("function %s of the function files is not in the installed schema", f)
		}
	}

	root, err := fs.Glob(files, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	// The detector finds the definitions of the migrations before the
	// function files (so it would find one in a later migration), and none
	// in a later one.
	before, after := 0, 0
	for _, n := range root {
		m := versionRE.FindStringSubmatch(n)
		if m == nil {
			t.Errorf("migration %s has no version number", n)
			continue
		}
		v, _ := strconv.Atoi(m[1])
		b, err := fs.ReadFile(files, n)
		if err != nil {
			t.Fatal(err)
		}
		defs := createFunctionRE.FindAllStringSubmatch(string(b), -1)
		if v <= lastWithoutFunctionFiles {
			before += len(defs)
			continue
		}
		after++
		if len(defs) > 0 {
			t.Errorf("migration %s defines function %s: a function's definition goes in its file under %s/", n, defs[0][1], migrations.FunctionsDir)
		}
	}
	t.Logf("%d versioned migrations: %d function definitions up to version %d, %d migrations after it checked to define none",
		len(root), before, lastWithoutFunctionFiles, after)
	if before == 0 {
		t.Fatalf("found no function definition in the migrations up to version %d: the detector finds nothing", lastWithoutFunctionFiles)
	}
}
