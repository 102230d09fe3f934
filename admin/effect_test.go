package admin

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// setEffect writes an intent's effect and not_before (nil: NULL) as the
// adapter runtime records them.
func (e *env) setEffect(id int64, effect outbox.Effect, notBefore *time.Time) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET effect = $2, not_before = $3 WHERE intent_id = $1`),
		id, string(effect), notBefore); err != nil {
		e.t.Fatal(err)
	}
}

// An intent's effect and not_before are in GET /api/v1/intents/{id}, in the
// list, and on the intent's page with what they mean.
func TestEffectAndNotBeforeShown(t *testing.T) {
	e := setup(t)
	e.atEpochOne("r")
	deferred := e.seedIntent(workerSecret, "r", "deferred", outbox.StatusPending, "")
	due := time.Now().Add(90 * time.Second).UTC().Truncate(time.Millisecond)
	e.setEffect(deferred, outbox.EffectPossible, &due)
	done := e.seedIntent(workerSecret, "r", "done", outbox.StatusSucceeded, "")

	r := e.do("GET", fmt.Sprintf("/api/v1/intents/%d", deferred), operatorSecret, "")
	expect(t, r, http.StatusOK, "")
	nb, _ := r.obj["not_before"].(string)
	got, err := time.Parse(time.RFC3339Nano, nb)
	if r.obj["effect"] != "possible" || err != nil || !got.Equal(due) {
		t.Fatalf("GET = %s; want effect possible, not_before %s", r.raw, due.Format(time.RFC3339Nano))
	}
	r = e.do("GET", fmt.Sprintf("/api/v1/intents/%d", done), operatorSecret, "")
	if v, ok := r.obj["not_before"]; r.obj["effect"] != "done" || !ok || v != nil {
		t.Fatalf("GET = %s; want effect done, not_before null", r.raw)
	}
	r = e.do("GET", "/api/v1/intents?resource=r", operatorSecret, "")
	expect(t, r, http.StatusOK, "")
	seen := map[float64]map[string]any{}
	for _, it := range r.obj["intents"].([]any) {
		m := it.(map[string]any)
		seen[m["intent_id"].(float64)] = m
	}
	if len(seen) != 2 || seen[float64(deferred)]["effect"] != "possible" || seen[float64(deferred)]["not_before"] != nb ||
		seen[float64(done)]["effect"] != "done" {
		t.Fatalf("list = %s", r.raw)
	}

	c := newPageClient(t, e.ts.URL)
	c.header.Set("Authorization", "Bearer "+operatorSecret)
	c.expect(c.do("GET", fmt.Sprintf("/intents/%d", deferred), nil), http.StatusOK,
		`id="effect"`, ">possible<", "the effect may have happened", `id="not-before"`, "not before", fmtTime(due), `id="no-cancel"`)
	p := c.do("GET", fmt.Sprintf("/intents/%d", done), nil)
	c.expect(p, http.StatusOK, ">done<", "the effect happened")
	if strings.Contains(p.body, `id="not-before"`) {
		t.Fatal("a next attempt shown for an intent without a deferred retry")
	}
	c.expect(c.do("GET", "/intents?resource=r", nil), http.StatusOK, "effect possible")
}

// A bulk retry or cancel skips the intents whose effect is possible and
// counts them (skipped.effect_possible), in a dry run too; a bulk retry
// with force applies to them, recording forced; force is refused for the
// other actions.
func TestBulkSkipsEffectPossible(t *testing.T) {
	e := setup(t)
	e.atEpochOne("r")
	var possible, none []int64
	for i := range 3 {
		id := e.seedIntent(workerSecret, "r", fmt.Sprintf("p%d", i), outbox.StatusUnknown, "connection reset")
		e.putKey(id, idempotency.StateHeld, outbox.StatusUnknown)
		possible = append(possible, id)
	}
	for i := range 2 {
		// Unknown with effect none: written directly (the runtime marks
		// every unknown outcome possible), for a filter that matches both.
		id := e.seedIntent(workerSecret, "r", fmt.Sprintf("n%d", i), outbox.StatusUnknown, "connection reset")
		e.setEffect(id, outbox.EffectNone, nil)
		none = append(none, id)
	}
	bulk := func(body string) resp {
		e.t.Helper()
		r := e.do("POST", "/api/v1/intents/bulk", operatorSecret, body)
		expect(t, r, http.StatusOK, "")
		return r
	}
	skipped := func(r resp) map[string]any {
		m, _ := r.obj["skipped"].(map[string]any)
		return m
	}

	for _, action := range []string{"retry", "cancel"} {
		r := bulk(`{"action":"` + action + `","status":"unknown","dry_run":true}`)
		if r.obj["matched"] != 5.0 || r.obj["applied"] != 0.0 || skipped(r)["effect_possible"] != 3.0 {
			t.Fatalf("%s dry run = %s; want matched 5, skipped effect_possible 3", action, r.raw)
		}
	}
	r := bulk(`{"action":"retry","status":"unknown","force":true,"dry_run":true}`)
	if r.obj["matched"] != 5.0 || len(skipped(r)) != 0 {
		t.Fatalf("forced dry run = %s; want matched 5, nothing skipped", r.raw)
	}
	for _, b := range []string{
		`{"action":"cancel","status":"unknown","force":true,"dry_run":true}`,
		`{"action":"resolve","status":"unknown","outcome":"failed","force":true}`,
	} {
		expectField(t, e.do("POST", "/api/v1/intents/bulk", operatorSecret, b), "force")
	}

	// The real run without force: the effect-none intents retried, the
	// others skipped and counted, unchanged.
	r = bulk(`{"action":"retry","status":"unknown","note":"destination back"}`)
	if r.obj["matched"] != 5.0 || r.obj["applied"] != 2.0 || skipped(r)["effect_possible"] != 3.0 || len(skipped(r)) != 1 {
		t.Fatalf("bulk retry = %s; want applied 2, skipped effect_possible 3", r.raw)
	}
	for _, id := range none {
		if st := e.status(id); st != outbox.StatusPending {
			t.Errorf("intent %d (effect none) is %s, want pending", id, st)
		}
	}
	for _, id := range possible {
		if st, k := e.status(id), e.key(id); st != outbox.StatusUnknown || k == nil || k.State != idempotency.StateHeld {
			t.Errorf("intent %d (effect possible) is %s with key %+v after a bulk retry without force", id, st, k)
		}
	}
	// A bulk cancel skips them too.
	r = bulk(`{"action":"cancel","status":"unknown"}`)
	if r.obj["applied"] != 0.0 || skipped(r)["effect_possible"] != 3.0 {
		t.Fatalf("bulk cancel = %s", r.raw)
	}
	// With force: retried, their held keys deleted, forced in the history.
	r = bulk(`{"action":"retry","status":"unknown","force":true,"note":"checked: nothing arrived"}`)
	if r.obj["matched"] != 3.0 || r.obj["applied"] != 3.0 || len(skipped(r)) != 0 {
		t.Fatalf("forced bulk retry = %s", r.raw)
	}
	for _, id := range possible {
		if st, k := e.status(id), e.key(id); st != outbox.StatusPending || k != nil {
			t.Errorf("intent %d after a forced bulk retry: %s, key %+v; want pending, no key", id, st, k)
		}
		if n := e.count(`SELECT count(*) FROM fencegate.intent_events WHERE intent_id = $1 AND action = 'retry' AND note = $2`,
			id, operator.ForcedNote+"; checked: nothing arrived"); n != 1 {
			t.Errorf("intent %d: %d forced retry events, want 1", id, n)
		}
	}
}

// The pages: a retry of an intent whose effect is possible is refused (409,
// saying why) unless the form's force box is ticked; the bulk preview says
// how many would be skipped, and its apply form carries force.
func TestPagesEffectPossible(t *testing.T) {
	e := setupNoTokens(t)
	e.atEpochOne("r")
	id := e.seedIntent("", "r", "lost", outbox.StatusUnknown, "connection reset")
	e.putKey(id, idempotency.StateHeld, outbox.StatusUnknown)
	other := e.seedIntent("", "r", "other", outbox.StatusUnknown, "connection reset")
	c := newPageClient(t, e.ts.URL)
	ip := fmt.Sprintf("/intents/%d", id)
	page := c.do("GET", ip, nil)
	c.expect(page, http.StatusOK, `id="retry-force"`, "accept a second effect")
	csrf := csrfOf(t, page.body)

	c.expect(c.do("POST", ip+"/retry", url.Values{"csrf": {csrf}, "note": {"try again"}}), http.StatusConflict,
		"Cannot retry intent", "may have happened", "accept a second effect", ">try again</textarea>")
	c.expect(c.do("POST", ip+"/cancel", url.Values{"csrf": {csrf}}), http.StatusConflict, "Cannot cancel intent", "may have happened")
	if st := e.status(id); st != outbox.StatusUnknown {
		t.Fatalf("refused actions changed the status to %s", st)
	}

	// The bulk preview: both would be skipped without force.
	r := c.do("POST", "/intents/bulk", url.Values{"csrf": {csrf}, "action": {"retry"}, "status": {"unknown"}})
	c.expect(r, http.StatusOK, `id="bulk-skipped-effect"`, "<strong>2</strong> of the 2", "every matching intent would be skipped")
	if strings.Contains(r.body, `id="bulk-apply"`) {
		t.Fatal("the preview offers to apply a bulk retry that would skip every intent")
	}
	r = c.do("POST", "/intents/bulk", url.Values{"csrf": {csrf}, "action": {"retry"}, "status": {"unknown"}, "force": {"1"}})
	c.expect(r, http.StatusOK, "would touch <strong>2</strong>", "accept a second effect", `name="force" value="1"`, `id="bulk-apply"`)
	if strings.Contains(r.body, `id="bulk-skipped-effect"`) {
		t.Fatal("a forced preview says intents would be skipped")
	}

	// One intent with force from its page: 303, retried, key deleted.
	r = c.do("POST", ip+"/retry", url.Values{"csrf": {csrf}, "force": {"1"}, "note": {"checked the inbox"}})
	if r.code != http.StatusSeeOther {
		t.Fatalf("forced retry = %d: %s", r.code, r.body)
	}
	if st, k := e.status(id), e.key(id); st != outbox.StatusPending || k != nil {
		t.Fatalf("after a forced retry: %s, key %+v", st, k)
	}
	c.expect(c.do("GET", ip, nil), http.StatusOK, operator.ForcedNote+"; checked the inbox")

	// The bulk apply without force: the other one skipped, the flash says why.
	r = c.do("POST", "/intents/bulk", url.Values{"csrf": {csrf}, "action": {"retry"}, "status": {"unknown"}, "step": {"apply"}})
	if r.code != http.StatusSeeOther || !strings.Contains(r.hdr.Get("Location"), "skipped_effect=1") {
		t.Fatalf("bulk apply = %d Location %q", r.code, r.hdr.Get("Location"))
	}
	c.expect(c.do("GET", r.hdr.Get("Location"), nil), http.StatusOK, "0 intents changed", "1 skipped because their effect may have happened")
	if st := e.status(other); st != outbox.StatusUnknown {
		t.Fatalf("the bulk retry without force changed intent %d to %s", other, st)
	}
}
