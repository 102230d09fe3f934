package idempotency_test

import (
	"testing"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// A Complete retried after its answer was lost answers as its first call
// did: an outcome that could not be recorded on an intent already final
// (cancelled meanwhile) is NotRecorded again on the retry, so that the
// runtime counts it (fencegate_adapter_outcome_not_recorded_total) whichever
// answer reached it; an ordinary retry is not.
func TestCompleteRetryAnswersLikeTheFirstCall(t *testing.T) {
	t.Parallel()
	f := setup(t, idempotency.Config{Schema: testdb.Schema()})
	for _, c := range []struct {
		key         string
		cancel      bool
		notRecorded bool
	}{{"cancelled", true, true}, {"ordinary", false, false}} {
		id := f.intent(c.key)
		d := f.begin(c.key, id)
		if c.cancel {
			f.exec(`UPDATE fencegate.intents SET status = 'cancelled' WHERE intent_id = $1`, id)
		}
		comp := idempotency.Completion{Kind: kind, Key: c.key, Token: d.Token, IntentID: id, Status: outbox.StatusSucceeded}
		first, err := f.store.CompleteOutcome(f.ctx, comp)
		if err != nil || first.NotRecorded != c.notRecorded {
			t.Fatalf("%s: first Complete = %+v, %v; want NotRecorded %v", c.key, first, err, c.notRecorded)
		}
		retry, err := f.store.CompleteOutcome(f.ctx, comp)
		if err != nil || retry.NotRecorded != c.notRecorded || retry.IntentUpdated {
			t.Fatalf("%s: retried Complete = %+v, %v; want NotRecorded %v, not updated", c.key, retry, err, c.notRecorded)
		}
	}
}
