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
	restore := testdb.SchemaBehind(t, pool)
	_, err := Start(ctx, Config{Pool: pool, Schema: testdb.Schema(), Dispatcher: &dispatcher.Config{}})
	if !isInvalid(err, "Schema") || !strings.Contains(err.Error(), "run gateway migrate") {
		t.Fatalf("Start on a schema lacking this build's newest migration = %v; want an InvalidError naming Schema", err)
	}
	restore()
	testdb.SchemaAhead(t, pool)
	startSaying(t, pool, "migrated by a newer build")
}

// startSaying starts and stops a relay on pool, which must say warning
// once in its log.
func startSaying(t *testing.T, pool *pgxpool.Pool, warning string) {
	t.Helper()
	var logs toolbin.SyncBuffer
	g, err := Start(context.Background(), Config{Pool: pool, Schema: testdb.Schema(), NATSURL: natstest.Start(t).URL,
		Dispatcher: &dispatcher.Config{}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("Start = %v; want it running, saying %q", err, warning)
	}
	g.Stop()
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Fatalf("%q said %d times, want once; logs:\n%s", warning, n, logs.String())
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
	startSaying(t, rolePool, "cannot read the schema's migrations")
}
