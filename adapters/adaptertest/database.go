package adaptertest

import (
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// What an adapter's tests need besides Env, for an author outside this
// module as much as inside: a package's TestMain, a database of its own per
// test, fencegate's schema in it and a JetStream server.

// EnvDatabaseURL names the environment variable with the URL of a running
// PostgreSQL server the tests create their databases on (its maintenance
// database, e.g. postgres://postgres@127.0.0.1:5432/postgres). Unset: the
// first test that needs a database starts a throwaway cluster from the
// PostgreSQL server binaries on the machine ($PG_BINDIR, the usual
// places, else initdb on $PATH), and Main stops it. A test never skips for want of PostgreSQL:
// it fails, saying why.
const EnvDatabaseURL = testdb.EnvURL

// EnvSchema names the environment variable with the schema the databases
// are migrated into (default "fencegate").
const EnvSchema = testdb.EnvSchema

// Main runs a package's tests and then stops the throwaway PostgreSQL
// cluster, if one was started. Call it from the package's TestMain:
//
//	func TestMain(m *testing.M) { adaptertest.Main(m) }
func Main(m *testing.M) { testdb.Main(m) }

// NewDatabase creates a database of the test's own, migrated (fencegate's
// tables in Schema()), dropped when the test ends, and returns its URL:
// what `gateway run --database-url`, pgxpool.New and a gateway.Config's
// pool take.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return testdb.NewURL(t)
}

// Schema is the schema NewDatabase and NewEnv migrate fencegate's tables
// into: $GATEWAY_TEST_SCHEMA, else "fencegate". Give it to every component
// a test makes (gateway.Config.Schema, outbox.Config.Schema, …).
func Schema() string { return testdb.Schema() }

// SQL rewrites a test's own statement, written for the default schema
// ("SELECT count(*) FROM fencegate.intents"), for Schema().
func SQL(query string) string { return testdb.SQL(query) }

// Getenv is an environment for cli.Options.Getenv: empty but for
// GATEWAY_SCHEMA, which is Schema(), so that a command line run in a test
// uses the test's schema and nothing of the machine's environment.
func Getenv(key string) string { return testdb.SchemaEnv(key) }

// StartNATS starts an embedded NATS server with JetStream on a free
// loopback port, its store under the test's temporary directory, shut
// down when the test ends, and returns its URL.
func StartNATS(t testing.TB) string {
	t.Helper()
	return natstest.Start(t).URL
}
