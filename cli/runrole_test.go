package cli

import (
	"net/url"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// runGrants are docs/operations.md's grants for the role `gateway run`
// connects as ("A role for gateway run"): the tables' rows, the sequences
// and the functions, and nothing of the schema itself ({schema} is the
// test's).
var runGrants = []string{
	"GRANT USAGE ON SCHEMA {schema} TO {role}",
	"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
	"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
	"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}",
}

// `gateway run` (relay and adapters) works as a role that owns nothing:
// granted only the rows of fencegate's tables, its sequences and its
// functions (docs/operations.md), not the schema the migrations made, so
// it cannot redefine the SECURITY DEFINER interface or drop a table. An
// intent enqueued by a worker settles, and the role is refused DDL.
func TestRunAsALeastAuthorityRole(t *testing.T) {
	t.Parallel()
	e := newRunEnv(t)
	grants := make([]string, len(runGrants))
	for i, g := range runGrants {
		grants[i] = strings.ReplaceAll(g, "{schema}", testdb.Schema())
	}
	role := testdb.Role(t, e.pool, "fg_run_", grants...)
	u, err := url.Parse(e.db)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, testdb.RolePassword)
	asRole := u.String()

	p := startRun(t, nil, asRole, e.natsURL, "--adapters", "file", "--file-root", t.TempDir(), "--poll-interval", "200ms")
	epoch := acquireLease(t, e.db, "least")
	id := enqueue(t, e.db, "--resource", "least", "--epoch", epoch, "--op", "least-1", "--kind", "file",
		"--payload", `{"target":"least.txt","content":"x"}`)
	waitStatus(t, e.db, id, "succeeded")
	// The role may not change the schema the interface lives in.
	c := testdb.ConnectAs(t, e.pool, role)
	if _, err := c.Exec(t.Context(), testdb.SQL(`CREATE OR REPLACE FUNCTION fencegate.fencegate_rule_set_applied() RETURNS boolean LANGUAGE sql AS 'SELECT false'`)); err == nil {
		t.Fatal("the run role redefined an interface function")
	}
	p.stop(t)
}
