package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/outbox"
)

// begin starts an attempt of intent id through the idempotency store, as
// the adapter runtime does when it receives the intent's message.
func (e *env) begin(id int64) (idempotency.Decision, error) {
	e.t.Helper()
	rec, err := e.ob.Get(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.srv.cfg.Store.Begin(context.Background(), rec.Kind, rec.IdempotencyKey, e.fingerprint(id), id)
}

// A pending intent whose attempt has begun (the adapter consumed the
// message before the dispatcher marked it relayed) is in flight: cancel is
// 409 invalid_state saying so, and nothing changes; the attempt's outcome
// is then recorded as what happened. Without an attempt, or once the
// attempt gave its key back (it did not perform the effect), cancel works
// and a later attempt is refused.
func TestCancelRefusedWhileAttemptInFlight(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.atEpochOne("r")
	act := func(id int64, action string) resp {
		return e.do("POST", fmt.Sprintf("/api/v1/intents/%d/%s", id, action), operatorSecret, `{"note":"customer asked"}`)
	}

	busy := e.seedIntent(workerSecret, "r", "busy", outbox.StatusPending, "")
	d, err := e.begin(busy)
	if err != nil || d.Outcome != idempotency.OutcomeExecute {
		t.Fatalf("Begin = %+v, %v", d, err)
	}
	events := e.count(`SELECT count(*) FROM fencegate.intent_events`)
	r := act(busy, "cancel")
	expect(t, r, http.StatusConflict, "invalid_state")
	msg, _ := r.errField("message").(string)
	if !strings.Contains(msg, "in flight") || !strings.Contains(msg, "wait for its outcome") {
		t.Fatalf("message = %q, want it to say the intent is in flight", msg)
	}
	if r.errField("status") != "pending" || r.errField("in_flight") != true {
		t.Fatalf("body = %s", r.raw)
	}
	if s := e.status(busy); s != outbox.StatusPending {
		t.Fatalf("status after refused cancel = %s", s)
	}
	if n := e.count(`SELECT count(*) FROM fencegate.intent_events`); n != events {
		t.Fatalf("refused cancel recorded an event: %d → %d", events, n)
	}

	// The operator's page shows the same refusal.
	c := newPageClient(t, e.ts.URL)
	intentPath := fmt.Sprintf("/intents/%d", busy)
	c.expect(c.do("POST", "/login", url.Values{"token": {operatorSecret}, "next": {intentPath}}), http.StatusSeeOther)
	page := c.do("GET", intentPath, nil)
	c.expect(page, http.StatusOK, `id="cancel"`)
	c.expect(c.do("POST", intentPath+"/cancel", url.Values{"csrf": {csrfOf(t, page.body)}}), http.StatusConflict,
		"in flight", "for its outcome")
	if s := e.status(busy); s != outbox.StatusPending {
		t.Fatalf("status after refused cancel on the page = %s", s)
	}

	// The attempt's outcome is what the intent ends with.
	rec, _ := e.ob.Get(ctx, busy)
	if _, err := e.srv.cfg.Store.Complete(ctx, idempotency.Completion{Kind: rec.Kind, Key: rec.IdempotencyKey,
		Token: d.Token, IntentID: busy, Status: outbox.StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	if s := e.status(busy); s != outbox.StatusSucceeded {
		t.Fatalf("status after the attempt = %s", s)
	}

	// No attempt: cancelled, and the next attempt is refused.
	idle := e.seedIntent(workerSecret, "r", "idle", outbox.StatusPending, "")
	r = act(idle, "cancel")
	expect(t, r, http.StatusOK, "")
	if r.obj["status"] != "cancelled" {
		t.Fatalf("cancel = %s", r.raw)
	}
	if _, err := e.begin(idle); !errors.Is(err, idempotency.ErrIntentTerminal) {
		t.Fatalf("Begin after cancel = %v, want ErrIntentTerminal", err)
	}

	// An attempt that released its key (a retryable refusal: the effect did
	// not happen) is over; attempts > 0 alone does not make it in flight.
	released := e.seedIntent(workerSecret, "r", "released", outbox.StatusPending, "")
	d, err = e.begin(released)
	if err != nil || d.Outcome != idempotency.OutcomeExecute {
		t.Fatalf("Begin = %+v, %v", d, err)
	}
	rec, _ = e.ob.Get(ctx, released)
	if err := e.srv.cfg.Store.Release(ctx, rec.Kind, rec.IdempotencyKey, d.Token); err != nil {
		t.Fatal(err)
	}
	expect(t, act(released, "cancel"), http.StatusOK, "")
	if s := e.status(released); s != outbox.StatusCancelled {
		t.Fatalf("status = %s", s)
	}
}
