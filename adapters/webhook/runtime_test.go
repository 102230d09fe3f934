package webhook_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/outbox"
)

// Integration scenarios: intents enqueued in PostgreSQL, relayed over
// JetStream, executed by the runtime with the webhook adapter against a
// real HTTP receiver on loopback.

func newEnv(t *testing.T, cfg webhook.Config, o adaptertest.Options) *adaptertest.Env {
	t.Helper()
	o.Executors = []adapters.Executor{newAdapter(t, cfg)}
	o.Runtime.ExecuteTimeout = time.Second
	o.Runtime.AckWait = 5 * time.Second
	o.Runtime.LookupSettle = cmpOr(o.Runtime.LookupSettle, 300*time.Millisecond)
	return adaptertest.NewEnv(t, o)
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

func enqueue(t *testing.T, e *adaptertest.Env, key string, p json.RawMessage) int64 {
	t.Helper()
	return e.Enqueue(t, e.Intent(webhook.Kind, key, key, p))
}

// 503, then 200: retried, succeeded, one effect.
func TestRuntime503Then200(t *testing.T) {
	t.Parallel()
	rc := newRefusingReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}}, adaptertest.Options{})
	key := adaptertest.UniqueKey(t)
	rec := e.WaitStatus(t, enqueue(t, e, key, payload(rc.URL, nil)), outbox.StatusSucceeded)
	if n := len(rc.got(key)); n != 2 || rc.effectsOf(key) != 1 || rec.Attempts != 2 {
		t.Errorf("%d requests, %d effects, %d attempts; want 2, 1, 2", n, rc.effectsOf(key), rec.Attempts)
	}
}

// A receiver that acts on the request and then answers 500 (or a proxy
// in front of it that gives up waiting, 502, 504): the effect may have
// happened. Not retried as if it had not (a second effect), and never
// failed: held unknown, effect possible, one request. It was retried
// until attempts ran out, then failed (effect none) after three effects.
func TestRuntime5xxAfterTheEffectIsUnknown(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout} {
		rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
			http.Error(w, "acted, then failed", code)
		})
		e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}}, adaptertest.Options{Runtime: executor.Config{MaxAttempts: 3}})
		key := adaptertest.UniqueKey(t)
		rec := e.WaitTerminal(t, enqueue(t, e, key, payload(rc.URL, nil)))
		if rec.Status != outbox.StatusUnknown || rec.Effect != outbox.EffectPossible {
			t.Errorf("%d after the effect: %s, effect %s (%s); want unknown, possible", code, rec.Status, rec.Effect, lastError(rec))
		}
		if n := rc.effectsOf(key); n != 1 {
			t.Errorf("%d after the effect: %d effects at the receiver, want 1", code, n)
		}
	}
}

// The same to a receiver that dedups on the key: resent with the same
// key, one effect, succeeded. A 302 after the effect (post, redirect,
// get) is no failure either.
func TestRuntime5xxAndSeeOtherResentToDedupReceiver(t *testing.T) {
	t.Parallel()
	for _, code := range []int{http.StatusBadGateway, http.StatusFound} {
		rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Location", "/done")
			w.WriteHeader(code)
		})
		rc.dedup = true
		e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}, DedupsOnKey: []string{rc.hostPort()}}, adaptertest.Options{})
		key := adaptertest.UniqueKey(t)
		rec := e.WaitTerminal(t, enqueue(t, e, key, payload(rc.URL, nil)))
		if rec.Status != outbox.StatusSucceeded || len(rc.got(key)) != 2 || rc.effectsOf(key) != 1 {
			t.Errorf("%d after the effect, to a receiver that dedups: %s (%s) after %d requests, %d effects; want succeeded after 2, 1",
				code, rec.Status, lastError(rec), len(rc.got(key)), rc.effectsOf(key))
		}
	}
}

// A 400 fails the intent for good, with the status in its last error.
func TestRuntime400Fails(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		http.Error(w, "unknown customer", http.StatusBadRequest)
	})
	e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}}, adaptertest.Options{})
	key := adaptertest.UniqueKey(t)
	rec := e.WaitStatus(t, enqueue(t, e, key, payload(rc.URL, nil)), outbox.StatusFailed)
	if rec.LastError == nil || !strings.Contains(*rec.LastError, "400") {
		t.Errorf("last error %v, want the 400", rec.LastError)
	}
	if n := len(rc.got(key)); n != 1 {
		t.Errorf("%d requests, want 1 (no retry of a 400)", n)
	}
}

// Retry-After is honoured: the second request comes no sooner.
func TestRuntimeRetryAfter(t *testing.T) {
	t.Parallel()
	rc := newRefusingReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}}, adaptertest.Options{})
	key := adaptertest.UniqueKey(t)
	e.WaitStatus(t, enqueue(t, e, key, payload(rc.URL, nil)), outbox.StatusSucceeded)
	got := rc.got(key)
	if len(got) != 2 {
		t.Fatalf("%d requests, want 2", len(got))
	}
	if gap := got[1].At.Sub(got[0].At); gap < time.Second {
		t.Errorf("the retry came %s after a 429 with Retry-After: 1, want at least 1s", gap)
	}
}

// hangAfterBody acts on the request, then never answers: the client
// gives up (the execute timeout) after the body was received.
func hangAfterBody(w http.ResponseWriter, r *http.Request, n int) {
	if n == 1 {
		<-r.Context().Done()
		return
	}
	_, _ = w.Write([]byte("second"))
}

// A reply that never comes after the body was received, to a receiver
// listed in DedupsOnKey: resent with the same Idempotency-Key, one effect,
// succeeded.
func TestRuntimeUnknownResentToDedupReceiver(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, hangAfterBody)
	rc.dedup = true
	e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}, DedupsOnKey: []string{rc.hostPort()}}, adaptertest.Options{})
	key := adaptertest.UniqueKey(t)
	e.WaitStatus(t, enqueue(t, e, key, payload(rc.URL, nil)), outbox.StatusSucceeded)
	got := rc.got(key)
	if len(got) != 2 || rc.effectsOf(key) != 1 {
		t.Fatalf("%d requests, %d effects; want 2 and 1", len(got), rc.effectsOf(key))
	}
	if got[0].Header.Get("Idempotency-Key") != got[1].Header.Get("Idempotency-Key") {
		t.Error("the resend carried another Idempotency-Key")
	}
}

// The same to a receiver that does not dedup, with no lookup_url: held
// unknown for an operator, never sent twice.
func TestRuntimeUnknownHeld(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, hangAfterBody)
	e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}}, adaptertest.Options{Runtime: executor.Config{Unknown: executor.UnknownResend}})
	key := adaptertest.UniqueKey(t)
	e.WaitStatus(t, enqueue(t, e, key, payload(rc.URL, nil)), outbox.StatusUnknown)
	if n := len(rc.got(key)); n != 1 {
		t.Errorf("%d requests, want 1 (held, not resent: the receiver does not dedup)", n)
	}
	if k := e.Key(t, webhook.Kind, key); k == nil || k.Status != outbox.StatusUnknown {
		t.Errorf("key %+v, want held unknown", k)
	}
}

// The same with a lookup_url: the lookup finds the effect, succeeded with
// found_by lookup, one request.
func TestRuntimeUnknownFoundByLookup(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, hangAfterBody)
	e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}}, adaptertest.Options{})
	key := adaptertest.UniqueKey(t)
	rec := e.WaitStatus(t, enqueue(t, e, key, payload(rc.URL, map[string]any{"lookup_url": rc.URL + "/lookup"})), outbox.StatusSucceeded)
	var res webhook.Result
	_ = json.Unmarshal(rec.Result, &res)
	if res.FoundBy != "lookup" || len(rc.got(key)) != 1 {
		t.Errorf("result %s after %d requests; want found_by lookup after 1", rec.Result, len(rc.got(key)))
	}
}

// A lookup_url that refuses the lookup for good (401) can never settle the
// unknown outcome: the intent is held unknown for an operator after one
// request, naming the refusal, where it stayed relayed, looked up again
// and again.
func TestRuntimeRefusedLookupHolds(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, hangAfterBody)
	lookup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no credentials", http.StatusUnauthorized)
	}))
	t.Cleanup(lookup.Close)
	lu, _ := url.Parse(lookup.URL)
	e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort(), lu.Host}}, adaptertest.Options{})
	key := adaptertest.UniqueKey(t)
	rec := e.WaitStatus(t, enqueue(t, e, key, payload(rc.URL, map[string]any{"lookup_url": lookup.URL + "/lookup"})), outbox.StatusUnknown)
	if len(rc.got(key)) != 1 || rec.Effect != outbox.EffectPossible || !strings.Contains(lastError(rec), "401") {
		t.Errorf("%d requests, effect %s, last_error %q; want 1, possible, naming the 401", len(rc.got(key)), rec.Effect, lastError(rec))
	}
}

// A lookup that finds nothing (404) is trusted only after the settle
// window; then the request is sent again, once.
func TestRuntimeLookupNotFoundAfterSettle(t *testing.T) {
	t.Parallel()
	rc := newRefusingReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		// Never acted on, and no answer: the lookup says 404.
		<-r.Context().Done()
	})
	settle := 700 * time.Millisecond
	e := newEnv(t, webhook.Config{Allow: []string{rc.hostPort()}}, adaptertest.Options{Runtime: executor.Config{LookupSettle: settle}})
	key := adaptertest.UniqueKey(t)
	e.WaitStatus(t, enqueue(t, e, key, payload(rc.URL, map[string]any{"lookup_url": rc.URL + "/lookup"})), outbox.StatusSucceeded)
	got := rc.got(key)
	if len(got) != 2 || rc.effectsOf(key) != 1 {
		t.Fatalf("%d requests, %d effects; want 2 and 1", len(got), rc.effectsOf(key))
	}
	rc.mu.Lock()
	lookups := rc.lookups[key]
	rc.mu.Unlock()
	if lookups < 1 {
		t.Errorf("%d lookups, want at least 1 before the resend", lookups)
	}
}

// The conformance suite, against a receiver that dedups and answers
// lookups.
func TestConformance(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	rc.dedup = true
	adaptertest.Run(t, adaptertest.Harness{
		New: func(t *testing.T) adapters.Executor {
			return newAdapter(t, webhook.Config{Allow: []string{rc.hostPort()}})
		},
		Payload: func(i int) json.RawMessage {
			return payload(rc.URL+"/hooks", map[string]any{"body": map[string]any{"i": i}, "lookup_url": rc.URL + "/lookup"})
		},
		Effects:   func(t *testing.T, req adapters.Request) int { return rc.effectsOf(req.IdempotencyKey) },
		HasLookup: true,
	})
}

// lastError is rec's last_error, "" when none.
func lastError(rec *outbox.Record) string {
	if rec.LastError == nil {
		return ""
	}
	return *rec.LastError
}
