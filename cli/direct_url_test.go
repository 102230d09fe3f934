package cli

import (
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// --database-direct-url must reach the database --database-url reaches
// (PostgreSQL itself, behind the pooler): one naming another database is
// exit 2 naming database_direct_url, before anything is migrated or
// listened on. It was used unchecked: gateway migrate migrated the other
// database and exited 0.
func TestDirectURLMustBeTheSameDatabase(t *testing.T) {
	t.Parallel()
	db, other := testdb.NewEmptyURL(t), testdb.NewEmptyURL(t)
	env := []string{"GATEWAY_DATABASE_DIRECT_URL=" + other}
	expectInvalid(t, gwEnv(t, env, db, "migrate"), "database_direct_url")
	// Nothing was migrated in either.
	expectInvalid(t, gw(t, other, "lease", "acquire", "--resource", "r", "--holder", "A", "--ttl", "60s"), "schema")
	expectInvalid(t, gw(t, db, "lease", "acquire", "--resource", "r", "--holder", "A", "--ttl", "60s"), "schema")
	// The same database by both: migrated, and status --wait listens there.
	same := []string{"GATEWAY_DATABASE_DIRECT_URL=" + db}
	expectCode(t, gwEnv(t, same, db, "migrate"), 0, "")
	expectCode(t, gwEnv(t, same, db, "status", "--resource", "r", "--op", "none"), 2, "not_found")
	expectInvalid(t, gwEnv(t, env, db, "status", "--resource", "r", "--op", "none", "--wait", "1s"), "database_direct_url")
}
