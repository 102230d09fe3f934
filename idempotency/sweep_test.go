package idempotency_test

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// age moves the key's completion (and creation) back by d.
func (f *fixture) age(key string, d time.Duration) {
	f.t.Helper()
	f.exec(`UPDATE fencegate.idempotency_keys
		SET completed_at = completed_at - $3::interval, created_at = created_at - $3::interval
		WHERE kind = $1 AND idempotency_key = $2`, kind, key, fmt.Sprintf("%d microseconds", d.Microseconds()))
}

func (f *fixture) exists(key string) bool {
	f.t.Helper()
	_, err := f.store.Get(f.ctx, kind, key)
	if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
		f.t.Fatal(err)
	}
	return err == nil
}

// Sweep deletes completed keys past retention, at most SweepBatch per
// statement, and nothing else.
func TestSweep(t *testing.T) {
	t.Parallel()
	const batch = 2
	f := setup(t, idempotency.Config{Schema: testdb.Schema(), SweepBatch: batch})
	day := 24 * time.Hour
	retention := f.store.Config().Retention

	var expired, kept []string
	for i := range 5 {
		key := fmt.Sprintf("old-%d", i)
		f.complete(key, f.begin(key, f.intent(key)), outbox.StatusSucceeded, "")
		f.age(key, retention+time.Duration(i+1)*day)
		expired = append(expired, key)
	}
	oldFailed := "old-failed"
	f.complete(oldFailed, f.begin(oldFailed, f.intent(oldFailed)), outbox.StatusFailed, "")
	f.age(oldFailed, retention+time.Hour)
	expired = append(expired, oldFailed)

	// Completed but within retention.
	recent := "recent"
	f.complete(recent, f.begin(recent, f.intent(recent)), outbox.StatusSucceeded, "")
	f.age(recent, retention-time.Hour)
	kept = append(kept, recent)
	// Started long ago and abandoned: may have happened; never swept.
	started := "started-old"
	f.begin(started, f.intent(started))
	f.expire(started)
	f.exec(`UPDATE fencegate.idempotency_keys SET created_at = now() - interval '400 days' WHERE idempotency_key = $1`, started)
	kept = append(kept, started)
	// Held with an unknown outcome: waits for an operator; never swept.
	held := "held-old"
	f.complete(held, f.begin(held, f.intent(held)), outbox.StatusUnknown, "")
	f.exec(`UPDATE fencegate.idempotency_keys SET created_at = now() - interval '400 days' WHERE idempotency_key = $1`, held)
	kept = append(kept, held)

	n, err := f.store.SweepOnce(f.ctx)
	if err != nil || n != batch {
		t.Fatalf("one sweep batch deleted %d (%v), want %d", n, err, batch)
	}
	// Oldest first.
	if f.exists("old-4") || f.exists("old-3") || !f.exists("old-2") {
		t.Fatal("the first batch did not take the oldest keys")
	}
	n, err = f.store.Sweep(f.ctx)
	if err != nil || n != len(expired)-batch {
		t.Fatalf("sweep deleted %d (%v), want the remaining %d", n, err, len(expired)-batch)
	}
	for _, key := range expired {
		if f.exists(key) {
			t.Errorf("expired key %q survived the sweep", key)
		}
	}
	for _, key := range kept {
		if !f.exists(key) {
			t.Errorf("key %q was swept", key)
		}
	}
	if n, err := f.store.Sweep(f.ctx); err != nil || n != 0 {
		t.Fatalf("second sweep deleted %d (%v), want 0", n, err)
	}
	// A swept key is new again.
	if d := f.begin("old-0", f.intent("old-0")); d.Outcome != idempotency.OutcomeExecute {
		t.Fatalf("after sweep: %+v, want execute", d)
	}
}

// The Sweeper sweeps right after Start and then every interval, and stops.
func TestSweeper(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema(), SweepInterval: 20 * time.Millisecond})
	retention := f.store.Config().Retention
	oldKey := func(key string) {
		f.complete(key, f.begin(key, f.intent(key)), outbox.StatusSucceeded, "")
		f.age(key, retention+time.Hour)
	}
	waitGone := func(key string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for f.exists(key) {
			if time.Now().After(deadline) {
				t.Fatalf("sweeper did not delete %q", key)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	oldKey("first")
	w := idempotency.NewSweeper(f.store)
	if err := w.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(f.ctx); err == nil {
		t.Fatal("second Start succeeded")
	}
	waitGone("first")
	oldKey("second")
	waitGone("second")
	w.Stop()
	select {
	case <-w.Stopped():
	default:
		t.Fatal("Stopped not closed after Stop")
	}
	w.Stop() // idempotent

	// Never started: Stop returns at once, and again (a second Stop once
	// panicked on a nil cancel func); a Start then says it was stopped.
	idle := idempotency.NewSweeper(f.store)
	idle.Stop()
	<-idle.Stopped()
	idle.Stop()
	err := idle.Start(f.ctx)
	if err == nil || !strings.Contains(err.Error(), "stopped before it was started") || strings.Contains(err.Error(), "already started") {
		t.Fatalf("Start after Stop = %v, want it to say the sweeper was stopped", err)
	}
}

// Completing a key can be a HOT update (a new row version on its page and
// no new index entries): no index of idempotency_keys covers, or has in its
// predicate, a column that Begin's completion writes. The sweeper, which
// needs an index, walks created_at (never written after the insert), and
// its plan uses that index.
func TestCompletionLeavesKeyIndexesAlone(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	// The columns the completing statements write (group.go's
	// completeBatch and store.go's Complete).
	written := []string{"state", "status", "locked_until", "result", "last_error", "completed_at", "updated_at"}
	rows, err := f.pool.Query(f.ctx, `
		SELECT c.relname, pg_get_indexdef(i.indexrelid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass`, testdb.Schema()+".idempotency_keys")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			t.Fatal(err)
		}
		n++
		// The definition after "USING btree": the columns and predicate.
		on := def[strings.Index(def, " USING "):]
		for _, col := range written {
			if regexp.MustCompile(`\b` + col + `\b`).MatchString(on) {
				t.Errorf("index %s (%s) has column %s, which completing a key writes: that update can never be HOT", name, def, col)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d indexes of idempotency_keys checked", n)
	if n < 2 {
		t.Fatalf("found %d indexes on idempotency_keys, want the primary key and the sweeper's", n)
	}

	plan := testdb.IndexPlan(t, f.pool, idempotency.SweepSQL, "720 hours", 1000)
	if !strings.Contains(plan, "idempotency_keys_created_idx") {
		t.Fatalf("the sweep does not use idempotency_keys_created_idx:\n%s", plan)
	}
}
