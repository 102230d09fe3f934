package adaptertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testhook"
	"github.com/fencegate/fencegate/outbox"
)

// Harness describes an adapter under test.
type Harness struct {
	// New returns a fresh executor for one test; what it writes must be
	// visible to Effects. Required.
	New func(t *testing.T) adapters.Executor
	// Payload returns a valid payload for the executor's kind, distinct for
	// every i (so that two payloads conflict under one idempotency key).
	// Required.
	Payload func(i int) json.RawMessage
	// Effects returns how many times the effect of req (its idempotency key,
	// and its target where the kind has one) is visible at the
	// destination. Required.
	Effects func(t *testing.T, req adapters.Request) int
	// HasLookup says the executor is an adapters.Looker whose lookup is
	// declared (Capabilities().Lookup). The suite checks
	// the claim, then checks Lookup, and recovery of a crash between the
	// effect and its record through the runtime.
	HasLookup bool
	// Kinds registers the executor's kind with the outbox when it is not
	// one of outbox.DefaultKinds.
	Kinds map[string]outbox.KindSpec
	// Runtime is the base runtime configuration (zero: defaults, with
	// millisecond retries).
	Runtime executor.Config
}

// Run runs the conformance suite: every adapter executes an intent once
// through the real runtime, never again on redelivery or for a second
// intent with the same business key, refuses a key reused with other
// content, reports a JSON object result, answers Lookup (if it has one) and
// gives up on a cancelled context.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Payload == nil || h.Effects == nil {
		t.Fatal("adaptertest: Harness needs New, Payload and Effects")
	}
	t.Run("ExecutesOnceAndRecords", func(t *testing.T) { t.Parallel(); testExecutesOnce(t, h) })
	t.Run("RedeliveryDoesNotExecuteAgain", func(t *testing.T) { t.Parallel(); testRedelivery(t, h) })
	t.Run("SameKeyLaterEpochGetsStoredResult", func(t *testing.T) { t.Parallel(); testSameKeyLaterEpoch(t, h) })
	t.Run("SameKeyDifferentContentConflicts", func(t *testing.T) { t.Parallel(); testConflict(t, h) })
	t.Run("ExecuteReturnsJSONObject", func(t *testing.T) { t.Parallel(); testExecuteDirect(t, h) })
	t.Run("CancelledContext", func(t *testing.T) { t.Parallel(); testCancelled(t, h) })
	t.Run("LookupCapability", func(t *testing.T) { t.Parallel(); testLookupClaim(t, h) })
	if h.HasLookup {
		t.Run("Lookup", func(t *testing.T) { t.Parallel(); testLookup(t, h) })
		t.Run("CrashAfterEffectRecoveredByLookup", func(t *testing.T) { t.Parallel(); testCrashAfterEffect(t, h) })
	}
}

// Counting wraps an executor and counts its Execute calls per idempotency
// key. It keeps the wrapped executor's Capabilities and Lookup, so the
// runtime treats it as it would the executor.
type Counting struct {
	adapters.Executor

	mu    sync.Mutex
	calls map[string]int
}

// NewCounting wraps ex.
func NewCounting(ex adapters.Executor) *Counting {
	return &Counting{Executor: ex, calls: map[string]int{}}
}

var _ adapters.Looker = (*Counting)(nil)

// Execute counts the call and runs the wrapped executor.
func (c *Counting) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	c.mu.Lock()
	c.calls[req.IdempotencyKey]++
	c.mu.Unlock()
	return c.Executor.Execute(ctx, req)
}

// Calls returns how many times Execute ran for key.
func (c *Counting) Calls(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[key]
}

// Lookup runs the wrapped executor's Lookup.
func (c *Counting) Lookup(ctx context.Context, req adapters.Request) (adapters.Outcome, bool, error) {
	l, ok := c.Executor.(adapters.Looker)
	if !ok {
		return adapters.Outcome{}, false, errors.New("adaptertest: executor has no lookup")
	}
	return l.Lookup(ctx, req)
}

func canLookup(ex adapters.Executor) bool {
	_, ok := ex.(adapters.Looker)
	return ok && ex.Capabilities().Lookup
}

// UniqueKey returns an idempotency key no other test uses.
func UniqueKey(t testing.TB) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return t.Name() + "/" + hex.EncodeToString(b)
}

// direct returns a request for executing ex without the runtime.
func direct(ex adapters.Executor, key string, intentID int64, payload json.RawMessage) adapters.Request {
	return adapters.Request{IntentID: intentID, Resource: DefaultResource, Epoch: 7, Kind: ex.Kind(),
		IdempotencyKey: key, Fence: outbox.FenceCommit, Payload: payload, Attempt: 1}
}

func checkObject(t *testing.T, what string, res json.RawMessage) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(res, &m); err != nil || m == nil {
		t.Errorf("%s result %s is not a JSON object (%v)", what, res, err)
	}
}

type fixture struct {
	env *Env
	ex  *Counting
}

func newFixture(t *testing.T, h Harness, o Options) fixture {
	t.Helper()
	ex := NewCounting(h.New(t))
	o.Kinds = h.Kinds
	o.Runtime = h.Runtime
	o.Executors = []adapters.Executor{ex}
	return fixture{env: NewEnv(t, o), ex: ex}
}

func (f fixture) enqueue(t *testing.T, op, key string, payload json.RawMessage) int64 {
	t.Helper()
	return f.env.Enqueue(t, f.env.Intent(f.ex.Kind(), op, key, payload))
}

// checkOnce checks that key's effect happened once: one Execute call and
// one visible effect.
func (f fixture) checkOnce(t *testing.T, h Harness, rec *outbox.Record, when string) {
	t.Helper()
	if n := f.ex.Calls(rec.IdempotencyKey); n != 1 {
		t.Errorf("%s: Execute ran %d times for key %q, want 1", when, n, rec.IdempotencyKey)
	}
	if n := h.Effects(t, Request(rec)); n != 1 {
		t.Errorf("%s: the effect is visible %d times at the destination, want 1", when, n)
	}
}

func testExecutesOnce(t *testing.T, h Harness) {
	f := newFixture(t, h, Options{})
	key := UniqueKey(t)
	id := f.enqueue(t, "op-1", key, h.Payload(0))
	rec := f.env.WaitStatus(t, id, outbox.StatusSucceeded)
	checkObject(t, "recorded", rec.Result)
	if rec.CompletedAt == nil || rec.Attempts != 1 {
		t.Errorf("record: completed_at %v, attempts %d; want set, 1", rec.CompletedAt, rec.Attempts)
	}
	if k := f.env.Key(t, f.ex.Kind(), key); k == nil || k.State != idempotency.StateCompleted || string(k.Result) != string(rec.Result) {
		t.Errorf("idempotency key = %+v; want completed with the intent's result", k)
	}
	f.checkOnce(t, h, rec, "after execution")
}

func testRedelivery(t *testing.T, h Harness) {
	f := newFixture(t, h, Options{})
	key := UniqueKey(t)
	id := f.enqueue(t, "op-1", key, h.Payload(10))
	first := f.env.WaitStatus(t, id, outbox.StatusSucceeded)

	// The dispatcher relays it again (a lost message, as far as it knows):
	// the runtime finds the key completed and records the stored result.
	f.env.Rerelay(t, id)
	again := f.env.WaitStatus(t, id, outbox.StatusSucceeded)
	if string(again.Result) != string(first.Result) {
		t.Errorf("result after re-relay %s, want the stored %s", again.Result, first.Result)
	}
	f.checkOnce(t, h, again, "after a re-relay")

	// A duplicate message of the terminal intent: acked, nothing done.
	f.env.Republish(t, id, h.Runtime.DurablePrefix)
	rec := f.env.Get(t, id)
	if rec.Status != outbox.StatusSucceeded || string(rec.Result) != string(first.Result) {
		t.Errorf("after a duplicate message: %s %s, want succeeded with %s", rec.Status, rec.Result, first.Result)
	}
	f.checkOnce(t, h, rec, "after a duplicate message")
}

// rerunAtNextEpoch runs payload first under a fresh key, then, after B
// took over (a newer epoch, another worker), payload second under the same
// key, and waits for that second intent to end as want.
func rerunAtNextEpoch(t *testing.T, h Harness, first, second int, want outbox.Status) (f fixture, a, b *outbox.Record) {
	t.Helper()
	f = newFixture(t, h, Options{})
	key := UniqueKey(t)
	a = f.env.WaitStatus(t, f.enqueue(t, "A-run", key, h.Payload(first)), outbox.StatusSucceeded)
	f.env.Advance(t, f.env.Epoch()+1)
	b = f.env.WaitStatus(t, f.enqueue(t, "B-run", key, h.Payload(second)), want)
	return f, a, b
}

func testSameKeyLaterEpoch(t *testing.T, h Harness) {
	f, first, second := rerunAtNextEpoch(t, h, 20, 20, outbox.StatusSucceeded)
	if second.Epoch <= first.Epoch {
		t.Fatalf("second intent at epoch %d, first at %d", second.Epoch, first.Epoch)
	}
	if string(second.Result) != string(first.Result) {
		t.Errorf("second intent's result %s, want the stored %s", second.Result, first.Result)
	}
	f.checkOnce(t, h, first, "after the second intent")
}

func testConflict(t *testing.T, h Harness) {
	f, first, other := rerunAtNextEpoch(t, h, 30, 31, outbox.StatusFailed)
	if other.LastError == nil || *other.LastError == "" {
		t.Errorf("conflicting intent failed without a reason")
	}
	// Execute ran once for the key: never for the conflicting intent.
	f.checkOnce(t, h, first, "after a conflicting intent")
}

func testExecuteDirect(t *testing.T, h Harness) {
	ex := h.New(t)
	req := direct(ex, UniqueKey(t), 40, h.Payload(40))
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	out, err := ex.Execute(ctx, req)
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if out.Status != "" && out.Status != outbox.StatusSucceeded {
		t.Errorf("status = %s, want succeeded", out.Status)
	}
	checkObject(t, "Execute's", out.Result)
	if n := h.Effects(t, req); n != 1 {
		t.Errorf("effect visible %d times, want 1", n)
	}
}

func testCancelled(t *testing.T, h Harness) {
	ex := h.New(t)
	req := direct(ex, UniqueKey(t), 50, h.Payload(50))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	type result struct {
		out adapters.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := ex.Execute(ctx, req)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			t.Fatalf("Execute with a cancelled context succeeded (%s %s); want an error", r.out.Status, r.out.Result)
		}
		if adapters.IsUnknown(r.err) {
			t.Errorf("Execute with a cancelled context: %v; nothing was started, want a retryable or permanent error", r.err)
		}
	case <-time.After(WaitTimeout):
		t.Fatalf("Execute with a cancelled context did not return in %s", WaitTimeout)
	}
	if n := h.Effects(t, req); n != 0 {
		t.Errorf("the effect is visible %d times after a cancelled Execute, want 0", n)
	}
}

func testLookupClaim(t *testing.T, h Harness) {
	ex := h.New(t)
	if got := canLookup(ex); got != h.HasLookup {
		t.Fatalf("the executor's lookup is available = %v, but Harness.HasLookup = %v", got, h.HasLookup)
	}
}

func testLookup(t *testing.T, h Harness) {
	ex := h.New(t)
	l := ex.(adapters.Looker)
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	req := direct(ex, UniqueKey(t), 60, h.Payload(60))
	if _, found, err := l.Lookup(ctx, req); err != nil || found {
		t.Fatalf("Lookup before Execute = found %v, %v; want not found", found, err)
	}
	if _, err := ex.Execute(ctx, req); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	out, found, err := l.Lookup(ctx, req)
	if err != nil || !found {
		t.Fatalf("Lookup after Execute = found %v, %v; want found", found, err)
	}
	if out.Status != outbox.StatusSucceeded {
		t.Errorf("Lookup status = %s, want succeeded", out.Status)
	}
	checkObject(t, "Lookup's", out.Result)
	unused := direct(ex, UniqueKey(t), 61, h.Payload(61))
	if out, found, err := l.Lookup(ctx, unused); err != nil || found {
		t.Errorf("Lookup of an unused key = found %v (%s), %v; want not found", found, out.Result, err)
	}
	if n := h.Effects(t, req); n != 1 {
		t.Errorf("effect visible %d times after Execute and Lookups, want 1", n)
	}
}

// StartCrashingProcess starts a process (StartProcess) that crashes right
// after its first effect, before it records the outcome: the crash after
// the effect that a lookup, or the destination's own fencing, must make
// good. WaitCrashed waits for it.
func (e *Env) StartCrashingProcess(t testing.TB, cfg executor.Config, executors ...adapters.Executor) *Process {
	t.Helper()
	var p *Process
	started := make(chan struct{})
	crash := testhook.WithRuntime(context.Background(), testhook.Runtime{AfterEffect: func(int64) {
		<-started // p is set
		p.Crash()
	}})
	p = e.StartProcessContext(crash, t, cfg, executors...)
	close(started)
	return p
}

// WaitCrashed waits until the process crashed, failing the test after
// WaitTimeout.
func (p *Process) WaitCrashed(t testing.TB) {
	t.Helper()
	select {
	case <-p.crashed:
	case <-time.After(WaitTimeout):
		t.Fatalf("adaptertest: the process did not crash in %s (no effect ran)", WaitTimeout)
	}
}

// testCrashAfterEffect: a runtime performs the effect and dies before it
// records the outcome. Another runtime gets the redelivery once the dead
// attempt's key lock expired, looks the effect up, and records it without
// executing again.
func testCrashAfterEffect(t *testing.T, h Harness) {
	const lockTimeout = 1500 * time.Millisecond
	cfg := h.Runtime
	cfg.ExecuteTimeout = 2 * time.Second
	cfg.AckWait = 3 * time.Second
	ex := NewCounting(h.New(t))
	env := NewEnv(t, Options{Kinds: h.Kinds, LockTimeout: lockTimeout})

	p := env.StartCrashingProcess(t, cfg, ex)
	key := UniqueKey(t)
	id := env.Enqueue(t, env.Intent(ex.Kind(), "op-1", key, h.Payload(70)))
	p.WaitCrashed(t)
	if rec := env.Get(t, id); rec.Status.Terminal() {
		t.Fatalf("intent %d is %s although its runtime crashed before recording", id, rec.Status)
	}
	if n := ex.Calls(key); n != 1 {
		t.Fatalf("Execute ran %d times before the crash", n)
	}
	env.StartRuntime(t, cfg, ex)
	rec := env.WaitStatus(t, id, outbox.StatusSucceeded)
	checkObject(t, "recovered", rec.Result)
	(fixture{env: env, ex: ex}).checkOnce(t, h, rec, "after the crash and redelivery")
}

// Describe formats an intent record for failure messages.
func Describe(rec *outbox.Record) string {
	return fmt.Sprintf("intent %d %s attempts=%d result=%s error=%q", rec.IntentID, rec.Status, rec.Attempts, rec.Result, LastError(rec))
}

// LastError is the record's last error, empty when it has none.
func LastError(rec *outbox.Record) string {
	if rec.LastError == nil {
		return ""
	}
	return *rec.LastError
}
