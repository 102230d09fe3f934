package email_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/smtptest"
	"github.com/fencegate/fencegate/outbox"
)

// Integration scenarios: intents enqueued in PostgreSQL, relayed over
// JetStream, executed by the runtime with the real email adapter against
// a real SMTP server (smtptest's fault-injecting server, or Mailpit).

func emailPayload() json.RawMessage {
	return json.RawMessage(`{"to":["alice@example.com"],"from":"gate@example.com","subject":"Nightly report 2026-12-01","text":"report\n"}`)
}

type emailEnv struct {
	*adaptertest.Env
	srv *smtptest.Server
	a   *email.Adapter
}

// newEmailEnv runs a runtime with an email adapter sending to a fresh
// fault-injecting SMTP server; lookup (nil: none) is its result lookup.
func newEmailEnv(t *testing.T, lookup func(*smtptest.Server) email.Lookup, o adaptertest.Options) emailEnv {
	t.Helper()
	srv := smtptest.NewServer(t)
	cfg := email.Config{Addr: srv.Addr, Timeout: 5 * time.Second}
	if lookup != nil {
		cfg.Lookup = lookup(srv)
	}
	a := newAdapter(t, cfg)
	o.Executors = []adapters.Executor{a}
	o.Runtime.ExecuteTimeout = 10 * time.Second
	o.Runtime.AckWait = 15 * time.Second
	return emailEnv{Env: adaptertest.NewEnv(t, o), srv: srv, a: a}
}

func serverLookup(s *smtptest.Server) email.Lookup { return s }

func (e emailEnv) enqueue(t *testing.T, op, key string) int64 {
	t.Helper()
	return e.Enqueue(t, e.Intent(email.Kind, op, key, emailPayload()))
}

func (e emailEnv) wantSent(t *testing.T, key string, n int) {
	t.Helper()
	if got := e.srv.Count(e.a.MessageID(key)); got != n {
		t.Fatalf("messages with the Message-ID of %q at the server: %d, want %d", key, got, n)
	}
}

// dropAfterAccept runs worker A's intent ("A-run") for a fresh key through
// a runtime whose server drops the connection after it accepted the
// message: the adapter never learns that it did.
func dropAfterAccept(t *testing.T, lookup func(*smtptest.Server) email.Lookup, o adaptertest.Options) (e emailEnv, key string, id int64) {
	t.Helper()
	e = newEmailEnv(t, lookup, o)
	e.srv.SetFault(smtptest.Fault{At: smtptest.PhaseData, Drop: true})
	key = uniqueKey(t)
	return e, key, e.enqueue(t, "A-run", key)
}

// redeliverAndRerun has the server work again, re-relays intent id, then
// has worker B (a later epoch) run the job again with the same key: both
// end as want, and no second message is sent.
func (e emailEnv) redeliverAndRerun(t *testing.T, id int64, key string, want outbox.Status) (again, second *outbox.Record) {
	t.Helper()
	e.srv.ClearFault()
	e.Rerelay(t, id)
	again = e.WaitStatus(t, id, want)
	e.wantSent(t, key, 1)
	e.Advance(t, e.Epoch()+1)
	second = e.WaitStatus(t, e.enqueue(t, "B-run", key), want)
	e.wantSent(t, key, 1)
	return again, second
}

// A normal send through the runtime: one message, with the deterministic
// Message-ID and the idempotency key, recorded as succeeded.
func TestRuntimeSend(t *testing.T) {
	t.Parallel()
	e := newEmailEnv(t, serverLookup, adaptertest.Options{})
	key := uniqueKey(t)
	rec := e.WaitStatus(t, e.enqueue(t, "op-1", key), outbox.StatusSucceeded)
	res := decodeResult(t, rec.Result)
	if res["message_id"] != e.a.MessageID(key) || !strings.HasPrefix(res["smtp_response"].(string), "250") {
		t.Fatalf("result = %s", rec.Result)
	}
	e.wantSent(t, key, 1)
	h, err := e.srv.Messages()[0].Header()
	if err != nil {
		t.Fatal(err)
	}
	if h.Get("Idempotency-Key") != key || h.Get("Message-Id") != e.a.MessageID(key) {
		t.Fatalf("headers: Idempotency-Key %q, Message-ID %q", h.Get("Idempotency-Key"), h.Get("Message-Id"))
	}
}

// The connection drops after the server accepted the message and before
// the adapter learned it: the outcome is unknown, the runtime looks it up,
// finds it and records success. Nothing is sent again, not by a re-relay,
// nor for another intent (a later epoch, another worker) with the same
// business key, which gets the stored result.
func TestRuntimeDropAfterAcceptLookedUp(t *testing.T) {
	t.Parallel()
	e, key, id := dropAfterAccept(t, serverLookup, adaptertest.Options{})
	rec := e.WaitStatus(t, id, outbox.StatusSucceeded)
	if res := decodeResult(t, rec.Result); res["found_by"] != "lookup" || res["message_id"] != e.a.MessageID(key) {
		t.Fatalf("result = %s; want found by lookup", rec.Result)
	}
	e.wantSent(t, key, 1)

	// The server works again; a redelivery changes nothing, and worker B
	// gets the stored result.
	again, second := e.redeliverAndRerun(t, id, key, outbox.StatusSucceeded)
	if string(again.Result) != string(rec.Result) {
		t.Fatalf("result after re-relay %s, want %s", again.Result, rec.Result)
	}
	if string(second.Result) != string(rec.Result) {
		t.Fatalf("second intent's result %s, want the stored %s", second.Result, rec.Result)
	}
}

// flakyLookup fails its first `fail` calls (the destination's API is down
// too), then asks the server.
type flakyLookup struct {
	srv   *smtptest.Server
	fail  int32
	calls atomic.Int32
}

func (l *flakyLookup) Find(ctx context.Context, id string) (bool, map[string]any, error) {
	if l.calls.Add(1) <= l.fail {
		return false, nil, errors.New("lookup API unavailable")
	}
	return l.srv.Find(ctx, id)
}

// As above, but the lookup right after the drop fails as well: the runtime
// keeps the key owned, and the redelivery looks the message up, records
// success, and sends nothing.
func TestRuntimeDropThenRedeliveryLooksUp(t *testing.T) {
	t.Parallel()
	var fl *flakyLookup
	e, key, id := dropAfterAccept(t, func(s *smtptest.Server) email.Lookup {
		fl = &flakyLookup{srv: s, fail: 1}
		return fl
	}, adaptertest.Options{LockTimeout: time.Second})
	rec := e.WaitStatus(t, id, outbox.StatusSucceeded)
	if res := decodeResult(t, rec.Result); res["found_by"] != "lookup" {
		t.Fatalf("result = %s; want found by lookup", rec.Result)
	}
	if n := fl.calls.Load(); n < 2 {
		t.Fatalf("lookups = %d; want the failed one and the redelivery's", n)
	}
	// (The redelivery resumes the key it still owns, waiting for proof,
	// without counting an attempt — or, if the lock expired first, takes
	// it over as a second one: attempts is 1 or 2. Nothing is sent twice.)
	e.wantSent(t, key, 1)
}

// SMTP 4xx: retried with backoff while the server refuses, then sent once
// when it accepts again.
func TestRuntimeTransientFailureRetried(t *testing.T) {
	t.Parallel()
	e := newEmailEnv(t, serverLookup, adaptertest.Options{Runtime: executor.Config{MaxAttempts: 1000}})
	e.srv.SetFault(smtptest.Fault{At: smtptest.PhaseRcpt, Code: 451, Message: "try again later"})
	key := uniqueKey(t)
	id := e.enqueue(t, "op-1", key)
	// A third attempt began: the first two were refused (attempts are
	// counted when one begins, so "2 and a 451 recorded" could be the
	// second one still running, and succeeding once the fault is cleared).
	e.WaitFor(t, id, "retried twice after a 451", func(r *outbox.Record) bool {
		return r.Attempts >= 3 && strings.Contains(adaptertest.LastError(r), "451")
	})
	if rec := e.Get(t, id); rec.Status.Terminal() {
		t.Fatalf("intent terminal while the server refuses: %s", adaptertest.Describe(rec))
	}
	e.wantSent(t, key, 0)
	e.srv.ClearFault()
	rec := e.WaitStatus(t, id, outbox.StatusSucceeded)
	if rec.Attempts < 3 {
		t.Fatalf("attempts = %d, want at least 3", rec.Attempts)
	}
	e.wantSent(t, key, 1)
}

// SMTP 5xx: failed at once, nothing sent, the reason recorded.
func TestRuntimePermanentFailure(t *testing.T) {
	t.Parallel()
	e := newEmailEnv(t, serverLookup, adaptertest.Options{})
	for _, f := range []smtptest.Fault{
		{At: smtptest.PhaseRcpt, Code: 550, Message: "no such user"},
		{At: smtptest.PhaseData, Code: 554, Message: "rejected"},
	} {
		e.srv.SetFault(f)
		key := uniqueKey(t)
		rec := e.WaitStatus(t, e.enqueue(t, "op-"+key, key), outbox.StatusFailed)
		if rec.Attempts != 1 || !strings.Contains(adaptertest.LastError(rec), f.Message) {
			t.Fatalf("%v: %s; want failed after 1 attempt with the reply", f, adaptertest.Describe(rec))
		}
		e.wantSent(t, key, 0)
	}
}

// No lookup configured and the outcome lost: the intent is held as unknown
// with its key, and nothing is re-sent — not by a redelivery, not for
// another intent with the same key.
func TestRuntimeUnknownWithoutLookupHeld(t *testing.T) {
	t.Parallel()
	e, key, id := dropAfterAccept(t, nil, adaptertest.Options{})
	rec := e.WaitStatus(t, id, outbox.StatusUnknown)
	if rec.Attempts != 1 || adaptertest.LastError(rec) == "" {
		t.Fatalf("%s; want unknown after 1 attempt with the reason", adaptertest.Describe(rec))
	}
	if k := e.Key(t, email.Kind, key); k == nil || k.State != idempotency.StateHeld {
		t.Fatalf("key = %+v; want held", k)
	}
	e.wantSent(t, key, 1)

	e.redeliverAndRerun(t, id, key, outbox.StatusUnknown)
	if k := e.Key(t, email.Kind, key); k == nil || k.State != idempotency.StateHeld {
		t.Fatalf("key after redelivery = %+v; want still held", k)
	}
}
