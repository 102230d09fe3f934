package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// Every `lease acquire` prints a new, higher epoch, also for the holder that
// already holds the lease; `lease renew` keeps it; the orphaned epoch is
// fenced (exit 3).
func TestCLIAcquireIsAlwaysANewEpoch(t *testing.T) {
	t.Parallel()
	db, _ := migratedDB(t)
	r := gw(t, db, "lease", "acquire", "--resource", "report", "--holder", "A", "--ttl", "30s")
	expectCode(t, r, 0, "")
	if r.obj["epoch"] != 1.0 {
		t.Fatalf("first acquire = %s; want epoch 1", r.stdout)
	}
	r = gw(t, db, "lease", "acquire", "--resource", "report", "--holder", "A", "--ttl", "30s")
	expectCode(t, r, 0, "")
	if r.obj["epoch"] != 2.0 || r.obj["holder"] != "A" {
		t.Fatalf("second acquire by the same holder = %s; want epoch 2", r.stdout)
	}
	r = gw(t, db, "enqueue", "--resource", "report", "--epoch", "1", "--op", "orphan", "--kind", "email", "--payload", cliEmail)
	expectCode(t, r, 3, "stale_epoch")
	if e := r.obj["error"].(map[string]any); e["current_epoch"] != 2.0 {
		t.Fatalf("stale = %s", r.stdout)
	}
	r = gw(t, db, "lease", "renew", "--resource", "report", "--holder", "A", "--epoch", "2", "--ttl", "30s")
	expectCode(t, r, 0, "")
	if r.obj["epoch"] != 2.0 {
		t.Fatalf("renew = %s; want epoch 2 kept", r.stdout)
	}
}

// Epochs above 2^53 are exit 2 naming epoch (checked before connecting);
// a resource at the ceiling answers acquire with exit 2 naming epoch and
// saying its epochs are exhausted, never exit 1.
func TestCLIEpochCeiling(t *testing.T) {
	t.Parallel()
	db, _ := migratedDB(t)
	expectInvalidAnyDB(t, db, []invalidArgs{
		{[]string{"epoch", "advance", "--resource", "r", "--epoch", "9223372036854775807"}, "epoch"},
		{[]string{"epoch", "advance", "--resource", "r", "--epoch", "9007199254740993"}, "epoch"},
		{[]string{"lease", "renew", "--resource", "r", "--holder", "h", "--epoch", "9007199254740993"}, "epoch"},
		{[]string{"lease", "release", "--resource", "r", "--holder", "h", "--epoch", "9007199254740993"}, "epoch"},
		{[]string{"enqueue", "--resource", "r", "--epoch", "9007199254740993", "--op", "o", "--kind", "email", "--payload", cliEmail}, "epoch"},
		{[]string{"lease", "acquire", "--resource", "r", "--holder", "h", "--lock-timeout", "-1s"}, "lock_timeout"},
		{[]string{"epoch", "advance", "--resource", "r", "--epoch", "5", "--lock-timeout", "-1ms"}, "lock_timeout"},
	})
	r := gw(t, db, "lease", "history", "--resource", "r")
	expectCode(t, r, 0, "")
	if g, _ := r.obj["grants"].([]any); len(g) != 0 {
		t.Fatalf("grants after bad input: %s", r.stdout)
	}

	r = gw(t, db, "epoch", "advance", "--resource", "r", "--epoch", "9007199254740992")
	expectCode(t, r, 0, "")
	if !strings.Contains(r.stdout, `"epoch":9007199254740992`) {
		t.Fatalf("advance to the ceiling = %s", r.stdout)
	}
	r = gw(t, db, "lease", "acquire", "--resource", "r", "--holder", "h", "--ttl", "30s")
	expectInvalid(t, r, "epoch")
	if !strings.Contains(r.obj["error"].(map[string]any)["message"].(string), "exhausted") {
		t.Fatalf("acquire at the ceiling = %s; want field epoch, a message saying the epochs are exhausted", r.stdout)
	}
}

// A grant, or an enqueue of the same resource, waits for the control-row
// lock at most --lock-timeout: with a worker paused inside EnqueueTx it
// exits 1 with code busy and says why; once the transaction ends, the
// takeover works.
func TestCLIBusy(t *testing.T) {
	t.Parallel()
	db, pool := migratedDB(t)
	acquireLease(t, db, "R")
	ctx := context.Background()
	ob := coretest.Outbox(t, pool)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	in := outbox.Intent{Resource: "R", Epoch: 1, OperationID: "paused", Kind: "email", Payload: json.RawMessage(cliEmail)}
	if _, err := ob.EnqueueTx(ctx, tx, in); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"lease", "acquire", "--resource", "R", "--holder", "B", "--ttl", "60s", "--lock-timeout", "200ms"},
		{"epoch", "advance", "--resource", "R", "--epoch", "50", "--lock-timeout", "200ms"},
		{"lease", "renew", "--resource", "R", "--holder", "A", "--epoch", "1", "--lock-timeout", "200ms"},
		{"lease", "release", "--resource", "R", "--holder", "A", "--epoch", "1", "--lock-timeout", "200ms"},
		// An enqueue of the same resource waits for the same lock.
		{"enqueue", "--resource", "R", "--epoch", "1", "--op", "behind", "--kind", "email", "--payload", cliEmail, "--lock-timeout", "200ms"},
	} {
		r := gw(t, db, args...)
		expectCode(t, r, 1, "busy")
		e := r.obj["error"].(map[string]any)
		if e["resource"] != "R" || !strings.Contains(e["message"].(string), "locked by an open transaction") ||
			!strings.Contains(r.stderr, "retry") {
			t.Fatalf("%v: %s (stderr %q); want the resource and a message saying why, and to retry", args, r.stdout, r.stderr)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.resources SET lease_expires_at = now() - interval '1 millisecond' WHERE resource_id = 'R'`)); err != nil {
		t.Fatal(err)
	}
	r := gw(t, db, "lease", "acquire", "--resource", "R", "--holder", "B", "--ttl", "60s", "--lock-timeout", "200ms")
	expectCode(t, r, 0, "")
	if r.obj["epoch"] != 2.0 {
		t.Fatalf("takeover after the transaction ended = %s; want epoch 2", r.stdout)
	}
}

// `gateway run --lock-timeout` (the admin intake's grants) refuses a
// negative bound before connecting.
func TestRunLockTimeoutFlag(t *testing.T) {
	t.Parallel()
	runBadFlags(t, nil, []string{"--lock-timeout", "-5s"}, "lock_timeout")
}

// --failover-epoch-jump: bad values are exit 2 naming the field before
// anything connects (lease acquire, epoch advance, run); the value reaches
// the issuer (a database with no recorded epoch authority, as after an
// operator accepted a restored one, raises every epoch by it at the next
// grant); a database restored from an older backup is refused, exit 1
// authority_changed.
func TestCLIFailoverEpochJump(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"lease", "acquire", "--resource", "r", "--holder", "A", "--failover-epoch-jump", "-1"},
		{"epoch", "advance", "--resource", "r", "--epoch", "3", "--failover-epoch-jump", "9007199254740993"},
	} {
		expectInvalid(t, gw(t, unreachableDB, args...), "failover_epoch_jump")
	}
	runBadFlags(t, nil, []string{"--failover-epoch-jump", "-5"}, "failover_epoch_jump")

	db, pool := migratedDB(t)
	expectCode(t, gw(t, db, "lease", "acquire", "--resource", "old", "--holder", "A"), 0, "")
	if _, err := pool.Exec(context.Background(), testdb.SQL(`DELETE FROM fencegate.epoch_authority`)); err != nil {
		t.Fatal(err)
	}
	r := gw(t, db, "lease", "acquire", "--resource", "new", "--holder", "A", "--failover-epoch-jump", "50")
	expectCode(t, r, 0, "")
	if r.obj["epoch"] != 51.0 {
		t.Fatalf("acquire after the raise = %s; want epoch 51 (floor 50 + 1)", r.stdout)
	}
	r = gw(t, db, "lease", "acquire", "--resource", "old", "--holder", "B")
	expectCode(t, r, 0, "")
	if r.obj["epoch"] != 52.0 {
		t.Fatalf("acquire of the raised resource = %s; want 52 (1 + 50, lease cleared, + 1)", r.stdout)
	}

	if _, err := pool.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.epoch_authority SET timeline_id = timeline_id + 1`)); err != nil {
		t.Fatal(err)
	}
	r = gw(t, db, "lease", "acquire", "--resource", "old", "--holder", "B")
	expectCode(t, r, 1, "authority_changed")
	if e := r.obj["error"].(map[string]any); e["reason"] != "timeline_backwards" || !strings.Contains(e["message"].(string), "timeline went backwards") {
		t.Fatalf("refused acquire = %s; want reason timeline_backwards named in the message", r.stdout)
	}
	expectCode(t, gw(t, db, "epoch", "advance", "--resource", "old", "--epoch", "100"), 1, "authority_changed")
}

// A CLI worker's refusals and grants are counted in the database (for the
// relay's scrape: fencegate_fence_refusals_total{path="cli"},
// fencegate_worker_lease_takeovers_total{path="cli"}), its refused
// transaction rolled back notwithstanding.
func TestCLICountsRefusalsInDatabase(t *testing.T) {
	t.Parallel()
	db, _ := migratedDB(t)
	expectCode(t, gw(t, db, "lease", "acquire", "--resource", "counted", "--holder", "A", "--ttl", "30s"), 0, "")
	expectCode(t, gw(t, db, "lease", "acquire", "--resource", "counted", "--holder", "A", "--ttl", "30s"), 0, "")
	expectCode(t, gw(t, db, "lease", "acquire", "--resource", "counted", "--holder", "B", "--ttl", "30s"), 4, "lease_held")
	expectCode(t, gw(t, db, "enqueue", "--resource", "counted", "--epoch", "1", "--op", "late", "--kind", "email", "--payload", cliEmail), 3, "stale_epoch")
	expectCode(t, gw(t, db, "lease", "renew", "--resource", "counted", "--holder", "A", "--epoch", "1", "--ttl", "30s"), 3, "stale_epoch")
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), `SELECT sequencename::text, coalesce(last_value, 0) FROM pg_sequences
		WHERE schemaname = $1 AND starts_with(sequencename::text, 'fence_count_')`, testdb.Schema())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		got[strings.TrimPrefix(name, "fence_count_")] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"cli_stale_epoch": 2, "cli_lease_held": 1, "cli_takeover_free": 1, "cli_takeover_reacquired": 1,
		"cli_takeover_after_expiry": 0, "sql_stale_epoch": 0}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("counter %s = %d, want %d (all: %v)", name, got[name], n, got)
		}
	}
	t.Logf("%d counters checked of %d", len(want), len(got))
}

// $GATEWAY_FAILOVER_EPOCH_JUMP is read by lease acquire and epoch advance
// as by run (every issuer of a database takes the same value from one
// place): a value that is not 0 to 2^53 is exit 2 naming
// failover_epoch_jump before connecting, one that does not parse never
// echoed; the command line wins over it; the value reaches the issuer.
func TestCLIFailoverEpochJumpFromEnv(t *testing.T) {
	t.Parallel()
	const unparsable = "jump-Q7x"
	commands := [][]string{
		{"lease", "acquire", "--resource", "r", "--holder", "A"},
		{"epoch", "advance", "--resource", "r", "--epoch", "3"},
	}
	checked := 0
	for _, args := range commands {
		for _, v := range []string{unparsable, "-5", "9007199254740993"} {
			r := gwEnv(t, []string{"GATEWAY_FAILOVER_EPOCH_JUMP=" + v}, unreachableDB, args...)
			expectInvalid(t, r, "failover_epoch_jump")
			if strings.Contains(r.stdout+r.stderr, unparsable) {
				t.Fatalf("%v: the variable's value is echoed: %s", args, r.stdout)
			}
			checked++
		}
		// The command line wins: the variable is not read.
		r := gwEnv(t, []string{"GATEWAY_FAILOVER_EPOCH_JUMP=" + unparsable}, unreachableDB, append(args, "--failover-epoch-jump", "0")...)
		expectCode(t, r, 1, "unavailable")
	}
	if checked == 0 {
		t.Fatal("nothing checked")
	}
	t.Logf("%d bad values refused", checked)

	db, pool := migratedDB(t)
	expectCode(t, gw(t, db, "lease", "acquire", "--resource", "old", "--holder", "A"), 0, "")
	if _, err := pool.Exec(context.Background(), testdb.SQL(`DELETE FROM fencegate.epoch_authority`)); err != nil {
		t.Fatal(err)
	}
	r := gwEnv(t, []string{"GATEWAY_FAILOVER_EPOCH_JUMP=50"}, db, "lease", "acquire", "--resource", "new", "--holder", "A")
	expectCode(t, r, 0, "")
	if r.obj["epoch"] != 51.0 {
		t.Fatalf("acquire after the raise = %s; want epoch 51 (floor 50 from $GATEWAY_FAILOVER_EPOCH_JUMP, + 1)", r.stdout)
	}
	if _, err := pool.Exec(context.Background(), testdb.SQL(`DELETE FROM fencegate.epoch_authority`)); err != nil {
		t.Fatal(err)
	}
	// Raised by 1000, not the default 1000000: 2000 is above the raise.
	r = gwEnv(t, []string{"GATEWAY_FAILOVER_EPOCH_JUMP=1000"}, db, "epoch", "advance", "--resource", "old", "--epoch", "2000")
	expectCode(t, r, 0, "")
	if r.obj["epoch"] != 2000.0 {
		t.Fatalf("advance after a raise of 1000 from $GATEWAY_FAILOVER_EPOCH_JUMP = %s; want epoch 2000", r.stdout)
	}
}
