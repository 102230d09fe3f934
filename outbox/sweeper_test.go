package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// The sweeper deletes intents completed longer ago than MaxAge with a swept
// status, in batches, and nothing else.
func TestSweeper(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "r", "A", time.Hour)
	const day = 24 * time.Hour
	type row struct {
		status string
		age    time.Duration // of completed_at; 0: not completed
		swept  bool
	}
	rows := []row{
		{"succeeded", 8 * day, true},
		{"failed", 9 * day, true},
		{"superseded", 30 * day, true},
		{"cancelled", 7*day + time.Hour, true},
		{"succeeded", 8 * day, true},
		{"succeeded", 6 * day, false},   // young
		{"unknown", 100 * day, false},   // waits for an operator
		{"relayed", 0, false},           // in progress
		{"pending", 0, false},           // in progress
		{"succeeded", time.Hour, false}, // young
		{"failed", 7*day - time.Hour, false},
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		res, err := b.client.Enqueue(ctx, emailIntent("r", l.Epoch, fmt.Sprintf("op-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = res.IntentID
		var completed any
		if r.age > 0 {
			completed = time.Now().Add(-r.age)
		}
		if _, err := b.pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.intents SET status = $2, completed_at = $3 WHERE intent_id = $1`),
			res.IntentID, r.status, completed); err != nil {
			t.Fatal(err)
		}
		// Each has an attempt in its history, swept with it.
		if _, err := b.pool.Exec(ctx, testdb.SQL(`INSERT INTO fencegate.intent_attempts (intent_id, attempt, ended_at, outcome) VALUES ($1, 1, now(), 'retry')`),
			res.IntentID); err != nil {
			t.Fatal(err)
		}
	}
	s, err := outbox.NewSweeper(b.pool, outbox.SweeperConfig{Schema: testdb.Schema(), MaxAge: 7 * day, KeyRetention: 7 * day, Batch: 2, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// A row someone holds locked is skipped, not waited for.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, testdb.SQL(`SELECT 1 FROM fencegate.intents WHERE intent_id = $1 FOR UPDATE`), ids[0]); err != nil {
		t.Fatal(err)
	}
	n, err := s.SweepOnce(ctx)
	if err != nil || n != 2 {
		t.Fatalf("one batch deleted %d (%v); want 2", n, err)
	}
	n, err = s.Sweep(ctx)
	if err != nil || n != 2 {
		t.Fatalf("sweep deleted %d (%v); want the 2 unlocked ones left", n, err)
	}
	_ = tx.Rollback(ctx)

	// Started in the background: it deletes the row that was locked.
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for exists(t, b, ids[0]) {
		if time.Now().After(deadline) {
			t.Fatal("the background sweep did not delete the unlocked row")
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	select {
	case <-s.Stopped():
	default:
		t.Fatal("Stopped not closed after Stop")
	}
	for i, r := range rows {
		if got := exists(t, b, ids[i]); got == r.swept {
			t.Fatalf("row %d (%s, age %s): exists=%v; want swept=%v", i, r.status, r.age, got, r.swept)
		}
		var attempts int
		if err := b.pool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.intent_attempts WHERE intent_id = $1`), ids[i]).Scan(&attempts); err != nil {
			t.Fatal(err)
		}
		if (attempts == 0) != r.swept {
			t.Fatalf("row %d (%s, age %s): %d attempts left; want them swept with the intent (swept=%v)", i, r.status, r.age, attempts, r.swept)
		}
	}
	if _, err := outbox.NewSweeper(b.pool, outbox.SweeperConfig{Schema: testdb.Schema(), Batch: -1}); err == nil {
		t.Fatal("a negative batch was accepted")
	}
	// Stop without Start returns.
	s2, _ := outbox.NewSweeper(b.pool, outbox.SweeperConfig{Schema: testdb.Schema()})
	s2.Stop()
}

func exists(t *testing.T, b bundle, id int64) bool {
	t.Helper()
	var one int
	err := b.pool.QueryRow(context.Background(), testdb.SQL(`SELECT 1 FROM fencegate.intents WHERE intent_id = $1`), id).Scan(&one)
	if err == pgx.ErrNoRows {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// Coalesced NOTIFY: a burst of enqueues sends far fewer notifications than
// intents, and a notification always follows the last commit.
func TestNotifyCoalescing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "r", "A", time.Hour)
	conn, err := pgx.Connect(ctx, b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN "+testdb.PGSchema().IntentsChannel()); err != nil {
		t.Fatal(err)
	}
	const window = 300 * time.Millisecond
	c, err := outbox.New(b.pool, outbox.Config{Schema: testdb.Schema(), NotifyWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	const n = 30
	start := time.Now()
	for i := range n {
		if _, err := c.Enqueue(ctx, emailIntent("r", l.Epoch, fmt.Sprintf("op-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	lastCommit := time.Now()
	// One in a transaction and one trailing per window the burst spans
	// (one window on a quick machine: two notifications; a slow one spans
	// more, and is checked against its own bound rather than skipped).
	windows := int(lastCommit.Sub(start)/window) + 1
	got := 0
	var lastAt time.Time
	for {
		wctx, cancel := context.WithTimeout(ctx, 3*window)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			break
		}
		got++
		lastAt = time.Now()
	}
	t.Logf("%d notifications for %d enqueues in %s (%d windows of %s)", got, n, lastCommit.Sub(start), windows, window)
	if got < 2 || got > 2*windows+1 || got >= n {
		t.Fatalf("%d notifications for %d enqueues over %d windows; want from 2 (one in a transaction, one trailing) to %d, fewer than the enqueues", got, n, windows, 2*windows+1)
	}
	if !lastAt.After(lastCommit) {
		t.Fatal("no notification after the last commit")
	}
	if d := lastAt.Sub(lastCommit); d > 2*window {
		t.Fatalf("the trailing notification came %s after the last commit; window %s", d, window)
	}
}

// The intents sweeper's query is served by an index (migration 00014):
// without it every sweep read the whole outbox (168 ms and 36,000 buffers
// at 300,000 completed intents). With sequential scans disabled, a missing
// index still shows as a Seq Scan in the plan.
func TestSweepQueryUsesIndex(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	// The sweeper's own statement, with its default age and batch.
	plan := testdb.IndexPlan(t, pool, outbox.SweepSQL, outbox.DefaultSweepMaxAge.Microseconds(), 1000)
	if !strings.Contains(plan, "intents_sweep_idx") {
		t.Fatalf("the sweep query does not use intents_sweep_idx:\n%s", plan)
	}
}

// A sweeper without a pool is bad input naming the argument, not a nil
// pointer met by its first sweep. (outbox.New takes a nil pool: a client
// that only validates.)
func TestNewSweeperRequiresPool(t *testing.T) {
	t.Parallel()
	coretest.Refused(t, map[string]func() error{
		"pool": func() error { _, err := outbox.NewSweeper(nil, outbox.SweeperConfig{}); return err },
	})
}
