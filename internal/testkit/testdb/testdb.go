// Package testdb gives each test its own freshly migrated PostgreSQL
// database, so tests run with t.Parallel() without seeing each other.
//
// The server is the one named by GATEWAY_TEST_DATABASE_URL when that is set
// (the test command sets it to a cluster it started), otherwise a throwaway
// cluster this test binary starts on first use and stops in Main. A test
// never skips for want of PostgreSQL: it fails, saying why.
package testdb

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
	"github.com/fencegate/fencegate/migrations"
)

// EnvURL names the environment variable with an existing server's URL.
const EnvURL = "GATEWAY_TEST_DATABASE_URL"

var (
	once     sync.Once
	onceErr  error
	baseURL  string
	template string
	// strategy is the CREATE DATABASE option that copies a database file
	// by file (" STRATEGY FILE_COPY", on PostgreSQL 15 and later, whose
	// default, WAL_LOG, writes every block of the copy to the WAL too:
	// ~150 ms a database on the CI machine against ~60 ms, a few hundred
	// databases a test run), or "" on older servers.
	strategy string
	cluster  *pgcluster.Cluster
	// createMu serialises CREATE DATABASE … TEMPLATE within this process;
	// PostgreSQL refuses to copy a template another session is copying from
	// only when someone is connected to it, but serialising keeps it cheap.
	createMu sync.Mutex
)

// Main runs the tests of a package and stops the throwaway cluster, if one
// was started. Use it from TestMain: `func TestMain(m *testing.M) { testdb.Main(m) }`.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run runs the tests of a package, stops the throwaway cluster if one was
// started, and returns the exit code instead of exiting, so TestMain can
// check more (leaked goroutines, say) before it calls os.Exit.
func Run(m *testing.M) int {
	code := m.Run()
	runExampleCleanups()
	if cluster != nil {
		_ = cluster.Stop()
	} else if template != "" {
		// A server of the caller's (GATEWAY_TEST_DATABASE_URL) keeps no
		// template of ours behind.
		drop(baseURL, template)
	}
	return code
}

// RunLeakChecked is Run, then the stops (servers the package's TestMain
// started), then, when the tests passed, a check for leaked goroutines (as
// goleak.VerifyTestMain would, but after the throwaway cluster and the
// servers are stopped); it returns the exit code for os.Exit.
func RunLeakChecked(m *testing.M, stops ...func()) int {
	code := Run(m)
	for _, stop := range stops {
		stop()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	return code
}

func setup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	baseURL = os.Getenv(EnvURL)
	if baseURL == "" {
		c, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return fmt.Errorf("start a throwaway PostgreSQL (set %s to use a running one): %w", EnvURL, err)
		}
		cluster = c
		baseURL = c.URL("postgres")
	}
	conn, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return fmt.Errorf("connect to test PostgreSQL at %s: %w", redact(baseURL), err)
	}
	defer conn.Close(ctx)
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return fmt.Errorf("server version: %w", err)
	}
	if version >= 150000 {
		strategy = " STRATEGY FILE_COPY"
	}
	template = "fencegate_tmpl_" + randHex(6)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+template+strategy); err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	pool, err := pgxpool.New(ctx, WithDB(baseURL, template))
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, decoysSQL); err != nil {
		return fmt.Errorf("template database: an application's tables: %w", err)
	}
	if _, err := Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate template database (schema %s): %w", Schema(), err)
	}
	return nil
}

// Server returns the URL of the test server's maintenance database, starting
// a cluster when needed.
func Server(t testing.TB) string {
	t.Helper()
	once.Do(func() { onceErr = setup() })
	if onceErr != nil {
		t.Fatalf("testdb: %v", onceErr)
	}
	return baseURL
}

// NewURL creates a new migrated database for the test, dropped at its end,
// and returns its URL.
func NewURL(t testing.TB) string {
	t.Helper()
	createMu.Lock()
	defer createMu.Unlock()
	return create(t, "fencegate_test_", true)
}

// create creates a database named prefix and a random suffix, a copy of
// the migrated template or empty, dropped at the test's end, and returns
// its URL.
func create(t testing.TB, prefix string, fromTemplate bool) string {
	t.Helper()
	base := Server(t) // sets up the template
	name := prefix + randHex(8)
	stmt := "CREATE DATABASE " + name
	if fromTemplate {
		stmt += " TEMPLATE " + template
	}
	stmt += strategy
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("testdb: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, stmt); err != nil {
		t.Fatalf("testdb: create database: %v", err)
	}
	t.Cleanup(func() { drop(base, name) })
	return WithDB(base, name)
}

// New creates a new migrated database for the test and returns a pool on it,
// closed at the test's end.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := NewURL(t)
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// WithDB returns rawURL with its database name replaced by db.
func WithDB(rawURL, db string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	u.Path = "/" + db
	return u.String()
}

func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// EnvSchema names the environment variable with the schema the tests
// migrate into and run in ("": pgschema.Default). The test command runs
// the suite twice: with the default schema and with another one.
const EnvSchema = "GATEWAY_TEST_SCHEMA"

// Schema is the schema the tests' databases are migrated into: every
// component a test makes must be given it (Config.Schema,
// lease.WithSchema, …), and a test's own SQL, written for the default
// schema ("fencegate.intents"), goes through SQL.
func Schema() string { return cmp.Or(os.Getenv(EnvSchema), pgschema.Default) }

// SQL rewrites a test's statement, written for the default schema
// ("SELECT … FROM fencegate.intents"), for Schema().
func SQL(query string) string { return pgschema.MustParse(Schema()).SQL(query) }

// Int returns the one integer query returns (a count, mostly), the
// statement written for the default schema (see SQL); the test fails on an
// error.
func Int(t testing.TB, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), SQL(query), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// LockControlRow locks resource's control row in an open transaction, as a
// worker paused inside outbox.EnqueueTx (or a lease grant) holds it, so
// that grants and enqueues of the resource wait, until unlock or the
// test's end. The row must exist (a lease was granted): a lock on nothing
// would make the test that relies on it vacuous.
func LockControlRow(t testing.TB, pool *pgxpool.Pool, resource string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var n int
	if err := tx.QueryRow(ctx, SQL(`SELECT count(*) FROM (SELECT 1 FROM fencegate.resources WHERE resource_id = $1 FOR UPDATE) l`), resource).Scan(&n); err != nil || n != 1 {
		t.Fatalf("lock the control row of %q: %d rows, %v", resource, n, err)
	}
	return func() {
		t.Helper()
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Strings returns the one text column of the rows query returns, the
// statement written for the default schema (see SQL); the test fails on an
// error.
func Strings(t testing.TB, pool *pgxpool.Pool, query string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), SQL(query), args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return out
}

// IndexPlan returns the plan PostgreSQL makes for query (written for the
// default schema, see SQL) with sequential scans disabled, so that a
// missing index shows as a Seq Scan; the test fails on an error.
func IndexPlan(t testing.TB, pool *pgxpool.Pool, query string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, `RESET enable_seqscan`) }()
	return Plan(t, conn, query, args...)
}

// Plan returns the plan PostgreSQL makes for query (written for the
// default schema, see SQL) with args, as the planner's settings stand
// (a statement with parameters is planned for these values); the test
// fails on an error.
func Plan(t testing.TB, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, query string, args ...any) string {
	t.Helper()
	rows, err := q.Query(context.Background(), "EXPLAIN "+SQL(query), args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", query, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", query, err)
	}
	return strings.Join(lines, "\n")
}

// Migrate migrates the database behind pool into Schema().
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]migrations.Applied, error) {
	return migrations.Up(ctx, pool, migrations.Config{Schema: Schema()})
}

// decoysSQL gives every test database an application's own tables in
// public with the names of fencegate's (an application may well have a
// table called intents): a statement of fencegate's that named a table
// without its schema would find these instead and fail, in every test,
// whatever the test schema is.
const decoysSQL = `
CREATE TABLE public.intents (app_intent text PRIMARY KEY);
CREATE TABLE public.resources (app_resource text PRIMARY KEY);
CREATE TABLE public.idempotency_keys (app_key text PRIMARY KEY);
CREATE TABLE public.intent_events (app_event text PRIMARY KEY);
CREATE TABLE public.epoch_grants (app_grant text PRIMARY KEY);
CREATE TABLE public.deployment (app_deployment text PRIMARY KEY);
CREATE TABLE public.epoch_authority (app_authority text PRIMARY KEY);
INSERT INTO public.intents VALUES ('an application''s own row');`

// PGSchema is Schema, parsed.
func PGSchema() pgschema.Schema { return pgschema.MustParse(Schema()) }

// SchemaEnv is an empty environment but for GATEWAY_SCHEMA, the test
// schema: for a command line run in the test with an environment of its
// own (cli.Options.Getenv).
func SchemaEnv(key string) string {
	if key == "GATEWAY_SCHEMA" {
		return Schema()
	}
	return ""
}

// NewEmptyURL creates a new database with nothing in it — not migrated,
// without the application's tables of the template — dropped at the
// test's end, and returns its URL: for tests of migrating itself.
func NewEmptyURL(t testing.TB) string {
	t.Helper()
	return create(t, "fencegate_empty_", false)
}

// drop drops database name of the server at base, connected anew (the
// test's connections are gone by its cleanup).
func drop(base, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}

// NewerMigration is the migration SchemaAhead records: one no build has.
const NewerMigration = 99999

// SchemaBehind makes the schema of pool's database look one migration
// behind this build: the newest migration's record is deleted, as goose
// does when it undoes one (what the migration made stays). restore puts
// the record back.
func SchemaBehind(t testing.TB, pool *pgxpool.Pool) (restore func()) {
	t.Helper()
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), SQL(sql)); err != nil {
			t.Fatal(err)
		}
	}
	newest := migrations.Latest()
	exec(fmt.Sprintf(`DELETE FROM fencegate.fencegate_schema_version WHERE version_id = %d`, newest))
	return func() {
		t.Helper()
		exec(fmt.Sprintf(`INSERT INTO fencegate.fencegate_schema_version (version_id, is_applied) VALUES (%d, true)`, newest))
	}
}

// SchemaAhead records NewerMigration as applied in the schema of pool's
// database: the schema as a newer build leaves it.
func SchemaAhead(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), SQL(fmt.Sprintf(
		`INSERT INTO fencegate.fencegate_schema_version (version_id, is_applied) VALUES (%d, true)`, NewerMigration))); err != nil {
		t.Fatal(err)
	}
}
