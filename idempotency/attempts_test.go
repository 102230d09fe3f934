package idempotency_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

type attemptRow struct {
	n                 int
	outcome, process  string
	started, hasError bool
}

func (f *fixture) attempts(intentID int64) []attemptRow {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, testdb.SQL(`SELECT attempt, outcome, coalesce(process, ''), started_at IS NOT NULL, error IS NOT NULL
		FROM fencegate.intent_attempts WHERE intent_id = $1 ORDER BY attempt`), intentID)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []attemptRow
	for rows.Next() {
		var a attemptRow
		if err := rows.Scan(&a.n, &a.outcome, &a.process, &a.started, &a.hasError); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// An attempt's history row is written with the write that ends it — alone
// and in a group commit — and an attempt that never ended is recorded as
// abandoned by the takeover of its key, before the takeover's own attempt.
func TestAttemptHistory(t *testing.T) {
	t.Parallel()
	for _, grouped := range []bool{false, true} {
		t.Run(fmt.Sprintf("group=%v", grouped), func(t *testing.T) {
			t.Parallel()
			f := setup(t, idempotency.Config{Schema: testdb.Schema(), GroupCommit: grouped})
			// Several completions at once: with group commit they share
			// batches, and each writes its row.
			const n = 8
			ids := make([]int64, n)
			var wg sync.WaitGroup
			for i := range n {
				key := fmt.Sprintf("k-%d", i)
				id, d := f.started(key)
				ids[i] = id
				wg.Go(func() {
					a := &idempotency.Attempt{Number: d.Attempts, Elapsed: time.Since(d.CountedAt), Process: "p1", Outcome: "succeeded", Token: d.Token}
					if _, err := f.store.CompleteOutcome(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token,
						IntentID: id, Status: outbox.StatusSucceeded, Attempt: a}); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			for _, id := range ids {
				got := f.attempts(id)
				if len(got) != 1 || got[0].n != 1 || got[0].outcome != "succeeded" || got[0].process != "p1" || !got[0].started {
					t.Fatalf("intent %d: attempts %+v, want one succeeded attempt by p1 with its start", id, got)
				}
				// The intent's timeline reads in order: the attempt ends
				// no later than the intent's completion it recorded (both
				// the writing transaction's time; the row's end was the
				// clock at the insert, after it).
				var inOrder bool
				if err := f.pool.QueryRow(f.ctx, testdb.SQL(`SELECT a.started_at <= a.ended_at AND a.ended_at <= i.completed_at
					FROM fencegate.intent_attempts a JOIN fencegate.intents i USING (intent_id) WHERE a.intent_id = $1`), id).Scan(&inOrder); err != nil || !inOrder {
					t.Errorf("intent %d: the attempt's started_at <= ended_at <= the intent's completed_at is %t (%v)", id, inOrder, err)
				}
			}

			// Abandoned: attempt 1 never ends; its lock expires; the
			// redelivery takes the key over (Recover) as attempt 2.
			id, d1 := f.started("abandoned")
			if d1.CountedAt.IsZero() {
				t.Fatal("Begin counted an attempt without CountedAt")
			}
			f.expire("abandoned")
			d2 := f.begin("abandoned", id)
			if d2.Outcome != idempotency.OutcomeRecover || d2.Attempts != 2 || d2.CountedAt.IsZero() {
				t.Fatalf("takeover: %+v", d2)
			}
			got := f.attempts(id)
			if len(got) != 1 || got[0].n != 1 || got[0].outcome != idempotency.AttemptAbandoned || got[0].started || !got[0].hasError {
				t.Fatalf("after the takeover: attempts %+v, want attempt 1 abandoned (no start known, a note)", got)
			}
			a := &idempotency.Attempt{Number: 2, Outcome: "succeeded", Lookup: "found", Token: d2.Token}
			if _, err := f.store.CompleteOutcome(f.ctx, idempotency.Completion{Kind: kind, Key: "abandoned", Token: d2.Token, IntentID: id,
				Status: outbox.StatusSucceeded, Attempt: a}); err != nil {
				t.Fatal(err)
			}
			if got := f.attempts(id); len(got) != 2 || got[1].outcome != "succeeded" {
				t.Fatalf("after the recovery: attempts %+v", got)
			}
			if r := f.record(id); r.Attempts != 2 {
				t.Fatalf("intent attempts %d, want 2 (as its history)", r.Attempts)
			}
			t.Logf("checked %d intents' attempt rows", n+1)
		})
	}
}
