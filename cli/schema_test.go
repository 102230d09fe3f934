package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

func errorField(r cliResult) string {
	e, _ := r.obj["error"].(map[string]any)
	f, _ := e["field"].(string)
	return f
}

// --schema ($GATEWAY_SCHEMA) is checked by every command: bad input
// naming schema, before anything connects.
func TestSchemaFlag(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"migrate", "--schema", "Bad-Name"}},
		{nil, []string{"lease", "acquire", "--schema", "pg_catalog", "--resource", "r", "--holder", "h"}},
		{[]string{"GATEWAY_SCHEMA=information_schema"}, []string{"status", "1"}},
		{nil, []string{"run", "--schema", strings.Repeat("s", 41), "--adapters", ""}},
		{nil, []string{"ls", "--schema", "1abc"}},
		{nil, []string{"migrate", "--schema", "user"}},
	} {
		r := gwEnv(t, c.env, "postgres://127.0.0.1:1/nowhere", c.args...)
		if r.code != 2 || errorField(r) != "schema" {
			t.Errorf("%v %v: exit %d, %s; want exit 2 naming schema", c.env, c.args, r.code, r.stdout)
		}
	}
}

// The migration path of an install from before schemas: its tables in
// public. A plain migrate or run into another schema is refused naming
// schema (and how to move), commands against a schema never migrated say
// so; migrate --move-from public moves it, epochs and all.
func TestMigrateMoveFromPublic(t *testing.T) {
	t.Parallel()
	db := testdb.NewEmptyURL(t)
	// Nothing migrated anywhere: run names schema, as every command does
	// (docs/cli.md; it named database_url).
	r := gwEnv(t, []string{"GATEWAY_SCHEMA=app_fencegate"}, db, "run", "--adapters", "", "--nats-url", "nats://127.0.0.1:1", "--allow-fsync-off")
	if r.code != 2 || errorField(r) != "schema" || !strings.Contains(r.stdout, "not migrated") {
		t.Fatalf("run in a database never migrated: exit %d %s; want exit 2 naming schema", r.code, r.stdout)
	}
	// The old install: everything in public.
	r = gw(t, db, "migrate", "--schema", "public")
	expectCode(t, r, 0, "")
	if r.obj["schema"] != "public" {
		t.Fatalf("migrate --schema public: %s", r.stdout)
	}
	r = gw(t, db, "lease", "acquire", "--schema", "public", "--resource", "r", "--holder", "A")
	expectCode(t, r, 0, "")
	epoch := r.obj["epoch"].(float64)

	const target = "app_fencegate"
	r = gw(t, db, "migrate", "--schema", target)
	if r.code != 2 || errorField(r) != "schema" || !strings.Contains(r.stdout, "--move-from public") {
		t.Fatalf("migrate into %s beside an install in public: exit %d %s; want exit 2 naming schema and --move-from", target, r.code, r.stdout)
	}
	r = gw(t, db, "lease", "acquire", "--schema", target, "--resource", "r", "--holder", "A")
	if r.code != 2 || errorField(r) != "schema" {
		t.Fatalf("lease acquire in the unmigrated %s: exit %d %s; want exit 2 naming schema", target, r.code, r.stdout)
	}
	r = gwEnv(t, []string{"GATEWAY_SCHEMA=" + target}, db, "run", "--adapters", "", "--nats-url", "nats://127.0.0.1:1", "--allow-fsync-off")
	if r.code != 2 || errorField(r) != "schema" {
		t.Fatalf("run in %s beside an install in public: exit %d %s; want exit 2 naming schema", target, r.code, r.stdout)
	}

	r = gw(t, db, "migrate", "--schema", target, "--move-from", "public")
	expectCode(t, r, 0, "")
	if moved, _ := r.obj["moved"].([]any); r.obj["schema"] != target || len(moved) < 8 {
		t.Fatalf("migrate --move-from public: %s", r.stdout)
	}
	r = gw(t, db, "lease", "acquire", "--schema", target, "--resource", "r", "--holder", "A")
	expectCode(t, r, 0, "")
	if r.obj["epoch"].(float64) != epoch+1 {
		t.Fatalf("epoch after the move = %v; want %v: the epochs came along", r.obj["epoch"], epoch+1)
	}
	r = gw(t, db, "migrate", "--schema", target, "--move-from", target)
	if r.code != 2 || errorField(r) != "move_from" {
		t.Fatalf("--move-from the schema itself: exit %d %s; want exit 2 naming move_from", r.code, r.stdout)
	}
}

// gateway migrate --move-from refuses, exit 2 naming the input and with
// nothing moved or created: a --move-from naming a schema that holds no
// install (a typo must not end in a fresh, empty install, which would
// hand out epochs again), and a --schema that holds an install already.
func TestMigrateMoveFromRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, conn := emptyDB(t)
	schemaExists := func(name string) bool {
		t.Helper()
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	installedIn := func(name string) bool {
		t.Helper()
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name+".fencegate_schema_version").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	checked := 0
	// No install anywhere: neither a missing schema nor public (which
	// exists, empty) is something to move from.
	for _, from := range []string{"nosuch", "public"} {
		r := gw(t, db, "migrate", "--schema", "audit3", "--move-from", from)
		checked++
		if r.code != 2 || errorField(r) != "move_from" || !strings.Contains(r.stdout, "no fencegate install in schema "+from) {
			t.Errorf("migrate --schema audit3 --move-from %s: exit %d %s; want exit 2 naming move_from", from, r.code, r.stdout)
		}
		if schemaExists("audit3") {
			t.Fatalf("the refused migrate --move-from %s created schema audit3", from)
		}
	}
	// An install in the target, and one in public: the move is refused
	// naming schema; both stay where they are.
	expectCode(t, gw(t, db, "migrate", "--schema", "occupied"), 0, "")
	expectCode(t, gw(t, db, "migrate", "--schema", "public", "--allow-unsafe-schema"), 0, "")
	r := gw(t, db, "migrate", "--schema", "occupied", "--move-from", "public")
	checked++
	if r.code != 2 || errorField(r) != "schema" || !strings.Contains(r.stdout, "holds an install already") {
		t.Errorf("migrate --schema occupied --move-from public: exit %d %s; want exit 2 naming schema", r.code, r.stdout)
	}
	if !installedIn("public") || !installedIn("occupied") {
		t.Errorf("after the refused move: install in public %t, in occupied %t; want both", installedIn("public"), installedIn("occupied"))
	}
	t.Logf("checked %d refusals", checked)
	if checked == 0 {
		t.Fatal("no refusal checked")
	}
}

// gateway migrate into a schema another role can create in is exit 2
// naming schema (the role named, and the way out), and installs nothing;
// --allow-unsafe-schema installs.
func TestMigrateRefusesSchemaOthersCanCreateIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, conn := emptyDB(t)
	role := testdb.Role(t, nil, "fg_hostile_cli_")
	if _, err := conn.Exec(ctx, "GRANT CREATE ON SCHEMA public TO "+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "DROP OWNED BY "+role) })
	r := gw(t, db, "migrate", "--schema", "public")
	if r.code != 2 || errorField(r) != "schema" || !strings.Contains(r.stdout, role) || !strings.Contains(r.stdout, "--allow-unsafe-schema") {
		t.Fatalf("migrate --schema public, %s can create there: exit %d %s; want exit 2 naming schema, the role and --allow-unsafe-schema", role, r.code, r.stdout)
	}
	var installed bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('public.fencegate_schema_version') IS NOT NULL`).Scan(&installed); err != nil || installed {
		t.Fatalf("a refused migrate installed: %t, %v", installed, err)
	}
	r = gw(t, db, "migrate", "--schema", "public", "--allow-unsafe-schema")
	expectCode(t, r, 0, "")
	if r.obj["schema"] != "public" {
		t.Fatalf("migrate --allow-unsafe-schema: %s", r.stdout)
	}
}

// emptyDB is a database of its own with nothing installed, and a
// connection to it (closed at the test's end).
func emptyDB(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	db := testdb.NewEmptyURL(t)
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return db, conn
}

// Versions on the command line: `gateway run` on a schema that lacks a
// migration of its build is exit 2 naming schema, saying to migrate; an
// older build's `gateway migrate` on a schema a newer build migrated is
// exit 0 with a warning and nothing applied, so that a rollback's migrate
// step passes (it re-applied its older function files).
func TestSchemaVersionsCLI(t *testing.T) {
	t.Parallel()
	db, pool := migratedDB(t)
	restore := testdb.SchemaBehind(t, pool)
	r := gw(t, db, "run", "--adapters", "", "--nats-url", "nats://127.0.0.1:1")
	if r.code != exitBadInput || errorField(r) != "schema" || !strings.Contains(r.stdout, "gateway migrate") {
		t.Fatalf("run on a schema lacking a migration: exit %d %s; want exit 2 naming schema", r.code, r.stdout)
	}
	restore()
	testdb.SchemaAhead(t, pool)
	r = gw(t, db, "migrate")
	expectCode(t, r, 0, "")
	if !strings.Contains(r.stderr, "migrated by a newer build") || r.obj["version"] != float64(testdb.NewerMigration) {
		t.Fatalf("migrate on a newer schema: %s, stderr %q; want version %d and a warning", r.stdout, r.stderr, testdb.NewerMigration)
	}
}

// Commands other than run on a schema that lacks a migration of their
// build (the new CLI, or a worker's, before the upgrade's gateway
// migrate): a statement that fails on what the missing migration adds is
// exit 2 naming schema and saying to run this build's gateway migrate, as
// run says at start. They said "not migrated in this schema" (lease) or
// exit 1 with PostgreSQL's "column does not exist" (status, ls).
func TestCommandsOnASchemaBehind(t *testing.T) {
	t.Parallel()
	db, pool := migratedDB(t)
	testdb.SchemaBehind(t, pool)
	// What a missing migration leaves out: a column, a function.
	for _, q := range []string{
		`ALTER TABLE fencegate.intents RENAME COLUMN effect TO effect_gone`,
		`DROP FUNCTION fencegate.fencegate_check_principal(text, text, boolean)`,
	} {
		if _, err := pool.Exec(context.Background(), testdb.SQL(q)); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"lease", "acquire", "--resource", "r", "--holder", "A"},
		{"status", "1"},
		{"ls"},
	} {
		r := gw(t, db, args...)
		if r.code != exitBadInput || errorField(r) != "schema" || !strings.Contains(r.stdout, "lacks migrations") ||
			!strings.Contains(r.stdout, "run gateway migrate") {
			t.Fatalf("gateway %v on a schema lacking a migration: exit %d %s; want exit 2 naming schema, saying it lacks migrations", args, r.code, r.stdout)
		}
	}
}
