package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
)

// TestAcknowledgedGrantAndEnqueueSurviveAnImmediateStop is the real-process
// form of the durability rule: a server with synchronous_commit=off and a
// WAL writer that flushes every 10 s acknowledges commits it has not
// written; `gateway lease acquire` and `gateway enqueue` are answered, the
// server is stopped at once (pg_ctl stop -m immediate), and after the
// restart both are still there, so the next grant is a new epoch.
func TestAcknowledgedGrantAndEnqueueSurviveAnImmediateStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true, Settings: pgcluster.AsyncCommit()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	db := c.URL("postgres")
	expectCode(t, gw(t, db, "migrate"), 0, "")
	// The migrations are on disk before the acknowledged work starts, and
	// one asynchronous commit passes first (the WAL writer flushes the
	// first after a quiet spell at once, which would hide a loss).
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE warmup (id int)`); err != nil {
		t.Fatal(err)
	}
	pool.Close()

	r := gw(t, db, "enqueue", "--resource", "other", "--epoch", "0", "--op", "x", "--kind", "email", "--payload", cliEmail)
	_ = r // epoch 0 is bad input; only there to run a CLI process before the grant
	epoch := acquireLease(t, db, "report")
	r = gw(t, db, "enqueue", "--resource", "report", "--epoch", epoch, "--op", "send-1", "--kind", "email", "--payload", cliEmail)
	expectCode(t, r, 0, "")
	acquireLease(t, db, "report-last")

	if err := c.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgain(ctx); err != nil {
		t.Fatal(err)
	}
	r = gw(t, db, "status", "--resource", "report", "--op", "send-1")
	expectCode(t, r, 0, "") // the acknowledged intent is there
	for _, res := range []string{"report", "report-last"} {
		r = gw(t, db, "lease", "acquire", "--resource", res, "--holder", "B", "--ttl", "1m")
		// A still holds it: the grant survived (a lost one would let B in
		// with the same epoch).
		expectCode(t, r, 4, "lease_held")
	}
}

// TestRefusesFsyncOff: run, migrate and dev refuse a server with fsync=off
// unless --allow-fsync-off (or $GATEWAY_ALLOW_FSYNC_OFF=true) says so.
func TestRefusesFsyncOff(t *testing.T) {
	t.Parallel()
	db := testdb.NewURL(t) // the test server runs with fsync=off
	deny := []string{"GATEWAY_ALLOW_FSYNC_OFF="}
	for _, args := range [][]string{
		{"migrate"},
		{"run", "--adapters", "file", "--dispatcher=false", "--nats-url", "nats://127.0.0.1:1"},
		{"dev", "--database-url", db, "--nats-url", "nats://127.0.0.1:1"},
	} {
		r := gwEnv(t, deny, db, args...)
		expectCode(t, r, 1, "unsafe_database")
		if msg := r.obj["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "fsync=off") || !strings.Contains(msg, "--allow-fsync-off") {
			t.Fatalf("%v: message %q should name fsync=off and the override", args, msg)
		}
	}
	r := gwEnv(t, deny, db, "migrate", "--allow-fsync-off")
	expectCode(t, r, 0, "")
	if !strings.Contains(r.stderr, "fsync=off") {
		t.Fatalf("an allowed fsync=off should warn on stderr, got %q", r.stderr)
	}
}

// $GATEWAY_ALLOW_FSYNC_OFF that is not a boolean is exit 2 naming
// allow_fsync_off before connecting, for migrate as for run and dev:
// never read as false (or true).
func TestFsyncOffVariableIsChecked(t *testing.T) {
	t.Parallel()
	commands := [][]string{
		{"migrate"},
		{"run", "--adapters", "", "--dispatcher=false"},
		{"dev", "--database-url", unreachableDB, "--nats-url", "nats://127.0.0.1:1"},
	}
	for _, args := range commands {
		r := gwEnv(t, []string{"GATEWAY_ALLOW_FSYNC_OFF=bogus"}, unreachableDB, args...)
		expectInvalid(t, r, "allow_fsync_off")
		if msg := r.obj["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "$GATEWAY_ALLOW_FSYNC_OFF") {
			t.Errorf("%v: message %q should name the variable", args, msg)
		}
	}
	if len(commands) == 0 {
		t.Fatal("nothing checked")
	}
	t.Logf("%d commands checked", len(commands))
	// The command line wins: the variable is not read.
	expectCode(t, gwEnv(t, []string{"GATEWAY_ALLOW_FSYNC_OFF=bogus"}, unreachableDB, "migrate", "--allow-fsync-off=false"), 1, "unavailable")
}
