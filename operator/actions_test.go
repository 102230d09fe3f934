package operator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/outbox"
)

// TestActionsAreAtomic races many cancels and retries on one intent: the
// status check and change are one step, so each committed action's
// from_status is the previous one's to_status.
func TestActionsAreAtomic(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	id := e.seed("op", outbox.StatusFailed, "boom")
	errs := make(chan error, 20)
	for i := range 20 {
		go func() {
			a := ActionRetry
			if i%2 == 1 {
				a = ActionCancel
			}
			_, err := e.op.Apply(ctx, ActionRequest{IntentID: id, Action: a, Actor: "t"})
			var ise *InvalidStateError
			if errors.As(err, &ise) {
				err = nil
			}
			errs <- err
		}()
	}
	for range 20 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	hist, err := e.op.History(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) == 0 {
		t.Fatal("no action committed")
	}
	prev := outbox.StatusFailed
	for _, ev := range hist {
		if ev.FromStatus != prev {
			t.Fatalf("event %+v does not follow %s: %+v", ev, prev, hist)
		}
		prev = ev.ToStatus
	}
	if s := e.status(id); s != prev {
		t.Fatalf("status %s, history ends at %s", s, prev)
	}
	t.Logf("%d actions committed of 20", len(hist))
}

// A cancel and an attempt's start race on many intents: they are ordered
// by the intent's row lock, so each intent ends either cancelled with its
// attempt refused and none counted, or pending with the attempt counted
// and the cancel refused as in flight — never cancelled with an attempt
// that went ahead.
func TestCancelAndAttemptStartAreOrdered(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	const n = 30
	wins := map[string]int{}
	for i := range n {
		id := e.seed(fmt.Sprintf("race-%d", i), outbox.StatusPending, "")
		rec, err := e.ob.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		fp := idempotency.Fingerprint(rec.Kind, rec.Payload)
		var (
			wg     sync.WaitGroup
			d      idempotency.Decision
			begErr error
			canErr error
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			d, begErr = e.store.Begin(ctx, rec.Kind, rec.IdempotencyKey, fp, id)
		}()
		go func() {
			defer wg.Done()
			_, canErr = e.op.Apply(ctx, ActionRequest{IntentID: id, Action: ActionCancel, Actor: "t"})
		}()
		wg.Wait()
		var ise *InvalidStateError
		switch {
		case begErr == nil && d.Outcome == idempotency.OutcomeExecute && errors.As(canErr, &ise) && ise.InFlight:
			wins["attempt"]++
			if s := e.status(id); s != outbox.StatusPending || e.attempts(id) != 1 {
				t.Fatalf("intent %d: attempt won but status %s, attempts %d", id, s, e.attempts(id))
			}
		case errors.Is(begErr, idempotency.ErrIntentTerminal) && canErr == nil:
			wins["cancel"]++
			if s := e.status(id); s != outbox.StatusCancelled || e.attempts(id) != 0 || e.key(id) != nil {
				t.Fatalf("intent %d: cancel won but status %s, attempts %d, key %+v", id, s, e.attempts(id), e.key(id))
			}
		default:
			t.Fatalf("intent %d: Begin = %+v, %v; cancel = %v (status %s)", id, d, begErr, canErr, e.status(id))
		}
	}
	if wins["attempt"]+wins["cancel"] != n {
		t.Fatalf("wins %v, want %d races decided", wins, n)
	}
	t.Logf("wins: %v", wins)
}

// AllowedFrom and AppliesTo answer from the same table the actions check.
func TestActionAllowedFrom(t *testing.T) {
	for a, want := range map[Action][]outbox.Status{
		ActionRetry:   {outbox.StatusFailed, outbox.StatusUnknown},
		ActionCancel:  {outbox.StatusPending, outbox.StatusFailed, outbox.StatusUnknown},
		ActionResolve: {outbox.StatusUnknown},
		"delete":      nil,
	} {
		got := a.AllowedFrom()
		if fmt.Sprint(got) != fmt.Sprint(want) || (want == nil) != (got == nil) {
			t.Errorf("%s.AllowedFrom() = %v, want %v", a, got, want)
		}
		n := 0
		for _, s := range Statuses {
			if a.AppliesTo(s) {
				n++
			}
		}
		if n != len(want) {
			t.Errorf("%s applies to %d statuses, want %d", a, n, len(want))
		}
	}
	// The returned slice is a copy: changing it changes no rule.
	ActionResolve.AllowedFrom()[0] = outbox.StatusPending
	if ActionResolve.AppliesTo(outbox.StatusPending) {
		t.Fatal("AllowedFrom returned the rule itself")
	}
}
