package idempotency_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// answer is a call's answer, reduced to what a caller acts on.
func answer(d idempotency.Decision, err error) string {
	var ie *idempotency.IntentTerminalError
	var inv *idempotency.InvalidError
	switch {
	case errors.As(err, &ie):
		return "terminal:" + string(ie.Status)
	case errors.Is(err, idempotency.ErrIntentNotFound):
		return "intent_not_found"
	case errors.Is(err, idempotency.ErrLostOwnership):
		return "lost_ownership"
	case errors.As(err, &inv):
		return "invalid:" + inv.Field
	case err != nil:
		return "error:" + err.Error()
	}
	s := fmt.Sprintf("%s attempts=%d", d.Outcome, d.Attempts)
	if d.Outcome == idempotency.OutcomeDone || d.Outcome == idempotency.OutcomeConflict || d.Held {
		s += fmt.Sprintf(" status=%s recorded=%v", d.Status, d.IntentRecorded)
	}
	return s
}

// groupScenario runs one mix of concurrent BeginRecording and
// CompleteOutcome calls — new keys, two calls of one key, done, busy,
// conflicting and held keys, a cancelled intent, an intent that does not
// exist; then completions by owners, a lost token, a retry, an intent
// cancelled meanwhile, unknown and superseded outcomes — and returns each
// call's answer and the database's state afterwards, both in a form that
// does not depend on which concurrent call won.
func groupScenario(t *testing.T, f *fixture) (answers []string, state []string) {
	t.Helper()
	other := idempotency.Fingerprint(kind, json.RawMessage(`{"other":true}`))
	// Keys decided before the concurrent calls, alone.
	doneOwner := f.intent("done")
	f.complete("done", f.begin("done", doneOwner), outbox.StatusSucceeded, `{"id":1}`)
	f.begin("busy", f.intent("busy"))
	f.begin("conflict", f.intent("conflict"))
	heldOwner := f.intent("held")
	f.complete("held", f.begin("held", heldOwner), outbox.StatusUnknown, "")

	type call struct {
		label, key, fp string
		id             int64
	}
	var calls []call
	for i := range 12 {
		k := fmt.Sprintf("new-%02d", i)
		calls = append(calls, call{"new", k, f.fp, f.intent(k)})
	}
	calls = append(calls,
		call{"dup", "dup", f.fp, f.intent("dup")},
		call{"dup", "dup", f.fp, f.intent("dup")},
		call{"done", "done", f.fp, f.intent("done")},
		call{"busy", "busy", f.fp, f.intent("busy")},
		call{"conflict", "conflict", other, f.intent("conflict")},
		call{"held", "held", f.fp, f.intent("held")},
	)
	cancelled := f.intent("cancelled")
	f.exec(`UPDATE fencegate.intents SET status = 'cancelled', completed_at = now() WHERE intent_id = $1`, cancelled)
	calls = append(calls, call{"cancelled", "cancelled", f.fp, cancelled}, call{"missing", "missing", f.fp, 9_000_000})

	decisions := make([]idempotency.Decision, len(calls))
	got := make([]string, len(calls))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, c := range calls {
		wg.Go(func() {
			<-start
			d, err := f.store.BeginRecording(f.ctx, kind, c.key, c.fp, c.id)
			decisions[i], got[i] = d, c.label+": "+answer(d, err)
		})
	}
	close(start)
	wg.Wait()
	answers = append(answers, got...)

	// Completions: by the owners of new keys with various outcomes, a
	// stale token, a retry of the same completion, an intent cancelled
	// after its Begin.
	type completion struct {
		label string
		c     idempotency.Completion
	}
	var comps []completion
	statuses := []outbox.Status{outbox.StatusSucceeded, outbox.StatusSucceeded, outbox.StatusFailed, outbox.StatusUnknown, outbox.StatusSuperseded}
	for i := range 12 {
		d := decisions[i]
		if d.Outcome != idempotency.OutcomeExecute {
			t.Fatalf("new key %d: %s", i, got[i])
		}
		c := idempotency.Completion{Kind: kind, Key: calls[i].key, Token: d.Token, IntentID: d.OwnerIntentID,
			Status: statuses[i%len(statuses)], Result: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
		switch i {
		case 5:
			c.Token += 1_000_000 // not the owner
			comps = append(comps, completion{"stale-token", c})
		case 6:
			comps = append(comps, completion{"retry", c}, completion{"retry", c})
		case 7:
			f.exec(`UPDATE fencegate.intents SET status = 'cancelled', completed_at = now() WHERE intent_id = $1`, c.IntentID)
			comps = append(comps, completion{"cancelled-meanwhile", c})
		case 8:
			c.Error = "smtp 550: no such user"
			c.Status = outbox.StatusFailed
			c.Result = nil
			comps = append(comps, completion{"failed", c})
		case 10:
			// The key's own intent deleted after its Begin: refused, and
			// the key stays started.
			f.exec(`DELETE FROM fencegate.intents WHERE intent_id = $1`, c.IntentID)
			comps = append(comps, completion{"intent-gone", c})
		case 11:
			c.IntentID = decisions[0].OwnerIntentID // another intent's
			comps = append(comps, completion{"wrong-intent", c})
		default:
			comps = append(comps, completion{"owner-" + string(c.Status), c})
		}
	}
	cgot := make([]string, len(comps))
	start = make(chan struct{})
	for i, c := range comps {
		wg.Go(func() {
			<-start
			res, err := f.store.CompleteOutcome(f.ctx, c.c)
			a := fmt.Sprintf("updated=%v not_recorded=%v", res.IntentUpdated, res.NotRecorded)
			if err != nil {
				a = answer(idempotency.Decision{}, err)
			}
			cgot[i] = c.label + ": " + a
		})
	}
	close(start)
	wg.Wait()
	answers = append(answers, cgot...)
	slices.Sort(answers)

	// Rows name intents by key, not id: which of two concurrent calls of
	// one key wins (executes) is not deterministic, and either is right.
	rows, err := f.pool.Query(f.ctx, testdb.SQL(`
		SELECT 'intent ' || idempotency_key || ' ' || status || ' attempts=' || attempts || ' result=' || coalesce(result::text, '-') ||
		       ' error=' || coalesce(last_error, '-') || ' completed=' || (completed_at IS NOT NULL)
		FROM fencegate.intents
		UNION ALL
		SELECT 'key ' || idempotency_key || ' ' || state || ' ' || coalesce(status, '-') || ' result=' || coalesce(result::text, '-') ||
		       ' error=' || coalesce(last_error, '-') || ' attempts=' || attempts || ' locked=' || (locked_until IS NOT NULL)
		FROM fencegate.idempotency_keys
		UNION ALL
		SELECT 'event ' || i.idempotency_key || ' ' || e.action FROM fencegate.intent_events e JOIN fencegate.intents i USING (intent_id)
		WHERE e.action <> 'enqueued'`))
	if err != nil {
		t.Fatal(err)
	}
	state, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(state)
	return answers, state
}

// TestGroupCommitAnswersAsAlone runs the same scenario on a store with group
// commit and on one without, each on a database of its own, and requires
// the same answer for every call and the same rows afterwards.
func TestGroupCommitAnswersAsAlone(t *testing.T) {
	t.Parallel()
	alone := setup(t, idempotency.Config{Schema: testdb.Schema()})
	grouped := setup(t, idempotency.Config{Schema: testdb.Schema(), GroupCommit: true})
	wantAnswers, wantState := groupScenario(t, alone)
	gotAnswers, gotState := groupScenario(t, grouped)
	if d := diff(wantAnswers, gotAnswers); d != "" {
		t.Errorf("answers differ (- alone, + grouped):\n%s", d)
	}
	if d := diff(wantState, gotState); d != "" {
		t.Errorf("state differs (- alone, + grouped):\n%s", d)
	}
	// The scenario itself: the answers a reader would expect.
	for _, want := range []string{
		"busy: busy attempts=0",
		"conflict: conflict attempts=0 status= recorded=true",
		"done: done attempts=0 status=succeeded recorded=true",
		"held: busy attempts=0 status=unknown recorded=true",
		"cancelled: terminal:cancelled",
		"missing: intent_not_found",
		"dup: execute attempts=1",
		"dup: busy attempts=0",
		"stale-token: lost_ownership",
		"retry: updated=true not_recorded=false",
		"retry: updated=false not_recorded=false",
		"cancelled-meanwhile: updated=false not_recorded=true",
		"intent-gone: intent_not_found",
		"wrong-intent: invalid:intent_id",
	} {
		if !slices.Contains(gotAnswers, want) {
			t.Errorf("grouped: no answer %q in\n%s", want, strings.Join(gotAnswers, "\n"))
		}
	}
	if t.Failed() {
		t.Logf("grouped answers:\n%s", strings.Join(gotAnswers, "\n"))
	}
}

func diff(a, b []string) string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, "- "+s)
		}
	}
	for _, s := range b {
		if !slices.Contains(a, s) {
			out = append(out, "+ "+s)
		}
	}
	return strings.Join(out, "\n")
}

// TestGroupCommitShares checks that concurrent Begins and Completes do share
// transactions (the keys of one batch carry one xmin), and that under
// concurrent calls over shared keys every key is executed exactly once
// (no two attempts own one key).
func TestGroupCommitShares(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	f := setup(t, idempotency.Config{Schema: testdb.Schema(), GroupCommit: true, Registerer: reg})
	const workers, perWorker, keys = 32, 16, 96
	ids := make([][]int64, workers)
	for w := range workers {
		for j := range perWorker {
			ids[w] = append(ids[w], f.intent(fmt.Sprintf("k-%d", (w*perWorker+j)%keys)))
		}
	}
	var mu sync.Mutex
	executed := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			<-start
			for j, id := range ids[w] {
				key := fmt.Sprintf("k-%d", (w*perWorker+j)%keys)
				d, err := f.store.BeginRecording(f.ctx, kind, key, f.fp, id)
				if err != nil {
					errs <- fmt.Errorf("begin %s: %w", key, err)
					return
				}
				if d.Outcome != idempotency.OutcomeExecute {
					continue // done, or busy while the owner runs: fine here
				}
				mu.Lock()
				executed[key]++
				mu.Unlock()
				if _, err := f.store.CompleteOutcome(f.ctx, idempotency.Completion{Kind: kind, Key: key, Token: d.Token,
					IntentID: id, Status: outbox.StatusSucceeded, Result: json.RawMessage(`{}`)}); err != nil {
					errs <- fmt.Errorf("complete %s: %w", key, err)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for k := range keys {
		if n := executed[fmt.Sprintf("k-%d", k)]; n != 1 {
			t.Errorf("key k-%d executed %d times", k, n)
		}
	}
	var txs, rows int
	if err := f.pool.QueryRow(f.ctx, testdb.SQL(`SELECT count(DISTINCT xmin::text), count(*) FROM fencegate.idempotency_keys`)).Scan(&txs, &rows); err != nil {
		t.Fatal(err)
	}
	if rows != keys {
		t.Fatalf("%d keys, want %d", rows, keys)
	}
	// The batch sizes are exported, per op; nothing failed.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	batches := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() == "fencegate_idempotency_group_batch_size" {
			for _, m := range mf.GetMetric() {
				batches[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
			}
		}
		if mf.GetName() == "fencegate_idempotency_group_failures_total" {
			// Both ops' series are there from the start, at 0.
			for _, m := range mf.GetMetric() {
				if m.GetCounter().GetValue() != 0 {
					t.Errorf("shared transactions failed: %v", mf.GetMetric())
				}
			}
		}
	}
	if batches["begin"] == 0 || batches["complete"] == 0 {
		t.Errorf("batch size samples %v; want begin and complete", batches)
	}
	if n := f.store.GroupFailures(); n != 0 {
		t.Errorf("GroupFailures = %d", n)
	}
	// Each completed key was last written by a Complete; shared
	// transactions leave far fewer distinct writers than keys.
	t.Logf("%d keys completed by %d transactions", rows, txs)
	if txs > keys/2 {
		t.Errorf("%d keys completed by %d transactions: completions did not share transactions", rows, txs)
	}
}

// While a shared transaction runs, a further one starts only once a whole
// batch (GroupMaxBatch calls) waits for it, for the Begins and the
// Completes alike: under load the batches grow rather than the
// transactions multiplying (internal/group's Backlog; measured in
// docs/performance.md).
func TestGroupStartsAnotherTransactionForAWholeBatch(t *testing.T) {
	t.Parallel()
	for _, max := range []int{0, 40} {
		f := setup(t, idempotency.Config{Schema: testdb.Schema(), GroupCommit: true, GroupMaxBatch: max})
		want := max
		if want == 0 {
			want = idempotency.DefaultGroupMaxBatch
		}
		if b, c := f.store.GroupBacklogs(); b != want || c != want {
			t.Errorf("GroupMaxBatch %d: a further Begin transaction starts at %d waiting calls, a Complete at %d; want %d", max, b, c, want)
		}
	}
}

// A shared transaction that failed because PostgreSQL was away is logged
// at debug (the runtime says the outage once), one the server refused at
// warning. Away includes a connection made while the server restarts,
// refused with 57P03 "the database system is starting up": it was a
// warning, which made TestRunPostgresOutageIsLoggedOnce fail when a retry
// landed in that moment.
func TestBatchFailureLevel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want slog.Level
	}{
		{errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"), slog.LevelDebug},
		{fmt.Errorf("failed to connect: %w", &pgconn.PgError{Code: "57P03", Message: "the database system is starting up"}), slog.LevelDebug},
		{&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, slog.LevelDebug},
		{&pgconn.PgError{Code: "08006", Message: "connection failure"}, slog.LevelDebug},
		{&pgconn.PgError{Code: "40P01", Message: "deadlock detected"}, slog.LevelWarn},
		{fmt.Errorf("complete: %w", &pgconn.PgError{Code: "23505", Message: "duplicate key"}), slog.LevelWarn},
	} {
		if got := idempotency.BatchFailureLevel(c.err); got != c.want {
			t.Errorf("%v: logged at %s, want %s", c.err, got, c.want)
		}
	}
}
