package gateway

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
)

// A schema that lacks a migration of this build is refused by Start,
// naming Schema and saying to migrate, before anything runs (it started,
// and would have failed later on what the migration adds). One a newer
// build migrated starts, saying so once: a rollback to this build, or the
// old processes of a rolling upgrade, must keep running.
func TestStartChecksTheSchemasMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, testdb.SQL(sql)); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE fencegate.fencegate_schema_version SET is_applied = false WHERE version_id = (SELECT max(version_id) FROM fencegate.fencegate_schema_version)`)
	_, err := Start(ctx, Config{Pool: pool, Schema: testdb.Schema(), Dispatcher: &dispatcher.Config{}})
	if !isInvalid(err, "Schema") || !strings.Contains(err.Error(), "run gateway migrate") {
		t.Fatalf("Start on a schema lacking this build's newest migration = %v; want an InvalidError naming Schema", err)
	}
	exec(`UPDATE fencegate.fencegate_schema_version SET is_applied = true`)
	exec(`INSERT INTO fencegate.fencegate_schema_version (version_id, is_applied) VALUES (99999, true)`)
	var logs toolbin.SyncBuffer
	g, err := Start(ctx, Config{Pool: pool, Schema: testdb.Schema(), NATSURL: natstest.Start(t).URL, Dispatcher: &dispatcher.Config{},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("Start on a schema a newer build migrated = %v; want it running", err)
	}
	g.Stop()
	if n := strings.Count(logs.String(), "migrated by a newer build"); n != 1 {
		t.Fatalf("%d warnings about the newer schema, want 1; logs:\n%s", n, logs.String())
	}
}

// A role that may not read the migrations' record (granted the working
// tables, not the version table) cannot have the schema compared: Start
// says so once and runs, where a refusal would stop a deployment whose
// grants were right before the check existed.
func TestStartWithoutTheMigrationsRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	s := testdb.Schema()
	role := testdb.Role(t, pool, "gw_",
		"GRANT USAGE ON SCHEMA "+s+" TO {role}",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "+s+" TO {role}",
		"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA "+s+" TO {role}",
		"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA "+s+" TO {role}",
		"REVOKE ALL ON "+s+".fencegate_schema_version FROM {role}")
	cfg := pool.Config().Copy()
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, testdb.RolePassword
	rolePool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rolePool.Close)
	var logs toolbin.SyncBuffer
	g, err := Start(ctx, Config{Pool: rolePool, Schema: s, NATSURL: natstest.Start(t).URL, Dispatcher: &dispatcher.Config{},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("Start as a role that may not read the migrations' record = %v; want it running, unchecked", err)
	}
	g.Stop()
	if n := strings.Count(logs.String(), "cannot read the schema's migrations"); n != 1 {
		t.Fatalf("%d warnings about the unread migrations, want 1; logs:\n%s", n, logs.String())
	}
}
