package clients_test

import (
	"testing"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// `with fencegate.connect(url) as fg:` (and `async with await
// fencegate.connect_async(url)`) ends as psycopg's `with conn` does: what
// the block did in the connection's own transaction is committed on a
// clean exit and rolled back when it raised. It was rolled back either
// way: an intent answered "created" was not stored.
func TestPythonConnectContextManager(t *testing.T) {
	cmd := langs[0].cmd(t)
	pool, dbURL := database(t)
	for _, c := range []struct {
		args   []string
		stored int
	}{
		{[]string{"ctx-1"}, 1},
		{[]string{"ctx-2", "raise"}, 0},
		{[]string{"ctx-3", "async"}, 1},
		{[]string{"ctx-4", "raise", "async"}, 0},
	} {
		resource := "ctx/" + c.args[0]
		got := run(t, cmd, dbURL, append([]string{"context", resource}, c.args...)...)
		if got["outcome"] != "created" {
			t.Fatalf("context %v = %v; want created", c.args, got)
		}
		n := testdb.Int(t, pool, `SELECT count(*) FROM fencegate.intents WHERE resource_id = $1`, resource) +
			testdb.Int(t, pool, `SELECT count(*) FROM fencegate.resources WHERE resource_id = $1 AND holder = 'ctx'`, resource)
		if n != 2*c.stored {
			t.Errorf("after `with fencegate.connect(...)` %v: %d rows of the lease and the intent, want %d", c.args, n, 2*c.stored)
		}
	}
}
