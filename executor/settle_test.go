package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testhook"
	"github.com/fencegate/fencegate/internal/testkit/metricstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/outbox"
)

// slowDest is a destination at the edge of the world whose effects may
// become visible late, whose answers may be lost, and whose Execute can be
// held at its entry by the test.
type slowDest struct {
	// late is how long after Execute returns its effect becomes visible
	// to Lookup.
	late time.Duration
	// unknownTimes: the first unknownTimes Executes lose their answer
	// (unknown outcome); with effectOnUnknown false they also perform
	// nothing.
	unknownTimes    int
	effectOnUnknown bool
	// heldByLookup: Lookup answers that it cannot settle the key (found,
	// Status unknown), as the s3 adapter does for an unsigned receipt.
	heldByLookup bool
	// lookupFails: while set, Lookup cannot ask the destination (an
	// error).
	lookupFails bool
	// lookupRefused: Lookup is refused for good (a PermanentError: the
	// lookup endpoint refuses the credentials).
	lookupRefused bool
	// gate, when set, holds every Execute at its entry until closed;
	// entered gets a value when an Execute arrives there.
	gate    chan struct{}
	entered chan struct{}
	opened  sync.Once

	mu        sync.Mutex
	execs     []execCall
	visibleAt map[string]time.Time
	lookups   int
}

type execCall struct{ start, end time.Time }

type slowExec struct{ d *slowDest }

func (e slowExec) Kind() string { return "test" }

func (e slowExec) Capabilities() adapters.Capabilities { return adapters.Capabilities{Lookup: true} }

func (e slowExec) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	e.d.hold()
	e.d.mu.Lock()
	defer e.d.mu.Unlock()
	start := time.Now()
	n := len(e.d.execs) + 1
	lost := n <= e.d.unknownTimes
	if !lost || e.d.effectOnUnknown {
		if _, ok := e.d.visibleAt[req.IdempotencyKey]; !ok {
			e.d.visibleAt[req.IdempotencyKey] = time.Now().Add(e.d.late)
		}
	}
	e.d.execs = append(e.d.execs, execCall{start: start, end: time.Now()})
	if lost {
		return adapters.Outcome{}, adapters.UnknownError(errors.New("connection dropped before the reply"))
	}
	res, _ := json.Marshal(map[string]any{"key": req.IdempotencyKey, "n": n})
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: res}, nil
}

func (e slowExec) Lookup(ctx context.Context, req adapters.Request) (adapters.Outcome, bool, error) {
	e.d.mu.Lock()
	defer e.d.mu.Unlock()
	e.d.lookups++
	if e.d.lookupFails {
		return adapters.Outcome{}, false, errors.New("lookup endpoint answered 500")
	}
	if e.d.lookupRefused {
		return adapters.Outcome{}, false, adapters.PermanentError(errors.New("lookup endpoint answered 401"))
	}
	if e.d.heldByLookup {
		return adapters.Outcome{Status: outbox.StatusUnknown, Result: json.RawMessage(`{"held":"a receipt that proves nothing"}`)}, true, nil
	}
	at, ok := e.d.visibleAt[req.IdempotencyKey]
	if !ok || time.Now().Before(at) {
		return adapters.Outcome{}, false, nil
	}
	res, _ := json.Marshal(map[string]any{"key": req.IdempotencyKey, "found_by": "lookup"})
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: res}, true, nil
}

// hold holds an Execute at its entry while the gate is set and closed,
// saying on entered that it arrived.
func (d *slowDest) hold() {
	if d.gate == nil {
		return
	}
	select {
	case d.entered <- struct{}{}:
	default:
	}
	<-d.gate
}

// open lets every held Execute go on; idempotent.
func (d *slowDest) open() { d.opened.Do(func() { close(d.gate) }) }

func (d *slowDest) calls() []execCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]execCall(nil), d.execs...)
}

func newSlowDest() *slowDest {
	return &slowDest{visibleAt: map[string]time.Time{}, entered: make(chan struct{}, 16)}
}

type slowEnv struct {
	*adaptertest.Env
	dest *slowDest
	reg  *prometheus.Registry
}

func setupSlow(t *testing.T, d *slowDest, cfg executor.Config, lockTimeout time.Duration) slowEnv {
	t.Helper()
	return setupSlowContext(context.Background(), t, d, cfg, lockTimeout)
}

// setupSlowContext is setupSlow with the runtime started with ctx (which
// may carry internal/testhook's hooks).
func setupSlowContext(ctx context.Context, t *testing.T, d *slowDest, cfg executor.Config, lockTimeout time.Duration) slowEnv {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	e := adaptertest.NewEnv(t, adaptertest.Options{
		Kinds:       testKinds,
		LockTimeout: lockTimeout,
	})
	e.Runtime = e.StartRuntimeContext(ctx, t, cfg, slowExec{d})
	if d.gate != nil {
		// Cleanups run last-in first-out: this one before the runtime's
		// Stop, which waits for the held Executes, also when a test
		// failed before opening the gate.
		t.Cleanup(d.open)
	}
	return slowEnv{Env: e, dest: d, reg: reg}
}

// counter returns the value of the counter name with the given labels.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	return metricstest.Value(metricstest.Find(t, reg, name, labels))
}

// waitCounter waits until the counter reaches want (or the wait times out)
// and returns its value then.
func waitCounter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, want float64) float64 {
	t.Helper()
	deadline := time.Now().Add(adaptertest.WaitTimeout)
	for {
		n := counter(t, reg, name, labels)
		if n >= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type event struct{ action, from, to, note string }

func events(t *testing.T, e *adaptertest.Env, id int64) []event {
	t.Helper()
	rows, err := e.Pool.Query(context.Background(), testdb.SQL(`SELECT action, from_status, to_status, coalesce(note, '') FROM fencegate.intent_events WHERE intent_id = $1 ORDER BY event_id`), id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []event
	for rows.Next() {
		var ev event
		if err := rows.Scan(&ev.action, &ev.from, &ev.to, &ev.note); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func findEvent(evs []event, action string) *event {
	for i := range evs {
		if evs[i].action == action {
			return &evs[i]
		}
	}
	return nil
}

// The destination took the effect but shows it only a second after the
// attempt's answer was lost. The lookup right after finds nothing; that is
// not proof, so the runtime waits (default settle window: 10 minutes) and
// records the effect once the lookup finds it. (Before: it re-executed at
// once, two effects.)
func TestLateEffectIsFoundNotRepeated(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.late, d.unknownTimes, d.effectOnUnknown = time.Second, 1, true
	e := setupSlow(t, d, executor.Config{MaxAttempts: 5}, 0)
	id := e.Enqueue(t, e.Intent("test", "op", "k", json.RawMessage(`{"mode":"ok"}`)))
	rec := e.WaitStatus(t, id, outbox.StatusSucceeded)
	var res map[string]any
	_ = json.Unmarshal(rec.Result, &res)
	if res["found_by"] != "lookup" {
		t.Fatalf("result %s; want found by lookup", rec.Result)
	}
	if n := len(d.calls()); n != 1 {
		t.Fatalf("executed %d times; want 1", n)
	}
	// The lookups are counted by result: at least one that found nothing,
	// then the one that found it.
	if nf, f := counter(t, e.reg, "fencegate_adapter_lookups_total", map[string]string{"kind": "test", "result": "not_found"}),
		counter(t, e.reg, "fencegate_adapter_lookups_total", map[string]string{"kind": "test", "result": "found"}); nf < 1 || f != 1 {
		t.Errorf("lookups counted: not_found %v, found %v; want at least 1 and 1", nf, f)
	}
}

// Two deliveries of one fence-execute intent, and the resource moves on
// between the first delivery's read of the intent and its fence check,
// while the second delivery is performing the effect. The first may not
// record superseded from its stale read (attempts 0): the effect happened.
func TestExecuteFenceShortcutDoesNotContradictAnAttempt(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.gate = make(chan struct{})
	var loads atomic.Int32
	firstLoaded, hold := make(chan struct{}), make(chan struct{})
	var unhold sync.Once
	release := func() { unhold.Do(func() { close(hold) }) }
	// The epochs the execute fence read, in order: the race is reached
	// only if a delivery read the moved-on epoch after the other began.
	var mu sync.Mutex
	var read []int64
	hooks := testhook.WithRuntime(context.Background(), testhook.Runtime{AfterLoad: func(int64) {
		if loads.Add(1) == 1 {
			close(firstLoaded)
			<-hold
		}
	}, FenceChecked: func(_, current int64) {
		mu.Lock()
		read = append(read, current)
		mu.Unlock()
	}})
	e := setupSlowContext(hooks, t, d, executor.Config{}, 0)
	t.Cleanup(release)
	id := e.EnqueueHeldBack(t, withFence(e.Intent("test", "op", "k", json.RawMessage(`{"mode":"ok"}`)), outbox.FenceExecute))
	e.Release(t, id)
	waitChan(t, firstLoaded, "the first delivery to load the intent")
	// The second delivery: a duplicate of the message.
	publishDuplicate(t, e.Env, id)
	waitChan(t, d.entered, "the second delivery to start executing")
	e.Advance(t, e.Epoch()+1)
	release()
	// The first delivery decides: superseded (the bug), or it goes
	// through the key and finds it busy (the second delivery owns it).
	busy := func() float64 {
		return counter(t, e.reg, "fencegate_adapter_outcomes_total", map[string]string{"kind": "test", "outcome": "busy"})
	}
	deadline := time.Now().Add(adaptertest.WaitTimeout)
	for !e.Get(t, id).Status.Terminal() && busy() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the first delivery neither recorded an outcome nor came back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.open()
	rec := e.WaitTerminal(t, id)
	if rec.Status != outbox.StatusSucceeded || len(d.calls()) != 1 {
		t.Fatalf("intent %s after %d effects; want succeeded, the effect that happened (%s)", rec.Status, len(d.calls()), adaptertest.Describe(rec))
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("epochs the execute fence read: %v (intent at %d)", read, rec.Epoch)
	if !slices.ContainsFunc(read, func(c int64) bool { return c > rec.Epoch }) {
		t.Fatalf("no delivery read the moved-on epoch (read %v, intent at %d): the race this test is about was not reached", read, rec.Epoch)
	}
}

// An operator cancels an intent while its effect is being performed. The
// cancel stands, and the effect's outcome, which can no longer be recorded
// on the intent, is kept in its history and counted.
func TestOutcomeOnFinalIntentRecordedInHistory(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.gate = make(chan struct{})
	e := setupSlow(t, d, executor.Config{}, 0)
	id := e.Enqueue(t, e.Intent("test", "op", "k", json.RawMessage(`{"mode":"ok"}`)))
	waitChan(t, d.entered, "the attempt to start executing")
	if _, err := e.Pool.Exec(context.Background(), testdb.SQL(`UPDATE fencegate.intents SET status = 'cancelled', completed_at = now(), updated_at = now() WHERE intent_id = $1`), id); err != nil {
		t.Fatal(err)
	}
	d.open()
	ev := waitEvent(t, e.Env, id, idempotency.EventOutcomeNotRecorded)
	if ev.from != "cancelled" || ev.to != "cancelled" || !strings.Contains(ev.note, "succeeded") {
		t.Fatalf("event %+v; want the succeeded outcome noted on the cancelled intent", ev)
	}
	if rec := e.Get(t, id); rec.Status != outbox.StatusCancelled {
		t.Fatalf("status %s; want the cancel to stand", rec.Status)
	}
	if k := e.Key(t, "test", "k"); k == nil || k.State != idempotency.StateCompleted {
		t.Fatalf("key %+v; want completed (the effect happened)", k)
	}
	// The event commits with the outcome's transaction; the runtime counts
	// it only after that commit returned (a count of an outcome whose
	// transaction rolled back would be false), so the count may come a
	// moment after the event is visible.
	if n := waitCounter(t, e.reg, "fencegate_adapter_outcome_not_recorded_total", map[string]string{"kind": "test"}, 1); n != 1 {
		t.Fatalf("fencegate_adapter_outcome_not_recorded_total = %v, want 1", n)
	}
}

// An attempt that runs past its lock is taken over; when its effect then
// completes, the runtime cannot record it under the key, and says so on the
// intent (history, metric) rather than dropping it.
func TestEffectAfterLostOwnershipRecorded(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.gate = make(chan struct{})
	const lock = 300 * time.Millisecond
	e := setupSlow(t, d, executor.Config{}, lock)
	payload := json.RawMessage(`{"mode":"ok"}`)
	id := e.Enqueue(t, e.Intent("test", "op", "k", payload))
	waitChan(t, d.entered, "the attempt to start executing")
	takeOver(t, e.Env, id, payload, lock)
	d.open()
	ev := waitEvent(t, e.Env, id, idempotency.EventEffectAfterLostOwnership)
	if !strings.Contains(ev.note, "succeeded") {
		t.Fatalf("event %+v; want the outcome in the note", ev)
	}
	if n := counter(t, e.reg, "fencegate_effect_after_lost_ownership_total", map[string]string{"kind": "test"}); n != 1 {
		t.Fatalf("fencegate_effect_after_lost_ownership_total = %v, want 1", n)
	}
}

// takeOver begins key "k" for intent id as another attempt would, once the
// running attempt's lock (lock) expired, polling until the key is taken
// over.
func takeOver(t *testing.T, e *adaptertest.Env, id int64, payload json.RawMessage, lock time.Duration) {
	t.Helper()
	deadline := time.Now().Add(adaptertest.WaitTimeout)
	for {
		dec, err := e.Store.Begin(context.Background(), "test", "k", idempotency.Fingerprint("test", payload), id)
		if err != nil {
			t.Fatal(err)
		}
		if dec.Outcome == idempotency.OutcomeRecover {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("begin = %+v; want a takeover", dec)
		}
		time.Sleep(lock / 4)
	}
}

func waitChan(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(adaptertest.WaitTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func waitEvent(t *testing.T, e *adaptertest.Env, id int64, action string) event {
	t.Helper()
	deadline := time.Now().Add(adaptertest.WaitTimeout)
	for {
		evs := events(t, e, id)
		if ev := findEvent(evs, action); ev != nil {
			return *ev
		}
		if time.Now().After(deadline) {
			t.Fatalf("intent %d: no %s event after %s; history %+v (%s)", id, action, adaptertest.WaitTimeout, evs, adaptertest.Describe(e.Get(t, id)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// publishDuplicate publishes the intent's message again, as a duplicate
// delivery, without waiting for it to be handled.
func publishDuplicate(t *testing.T, e *adaptertest.Env, id int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), adaptertest.WaitTimeout)
	defer cancel()
	js, err := jetstream.New(e.NC)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(wire.Namespace("").Subject("test"))
	msg.Header.Set(wire.HeaderIntentID, strconv.FormatInt(id, 10))
	msg.Header.Set(nats.MsgIdHdr, wire.Namespace("").MsgID(id, 999))
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("publish duplicate of intent %d: %v", id, err)
	}
}

// The answer of the first attempt is lost, and nothing happened at the
// destination. Its lookup finds nothing, which is proof only once the settle
// window has passed since the attempt's last I/O: until then the intent
// waits — relayed, its key owned, saying so in last_error and its history —
// and nothing is executed; after it, the runtime executes again.
func TestNegativeLookupWaitsForSettleWindow(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.unknownTimes = 1
	const settle = 2 * time.Second
	e := setupSlow(t, d, executor.Config{LookupSettle: settle}, 0)
	id := e.Enqueue(t, e.Intent("test", "op", "k", json.RawMessage(`{"mode":"ok"}`)))
	rec := e.WaitFor(t, id, "waiting for proof", func(r *outbox.Record) bool {
		return strings.HasPrefix(adaptertest.LastError(r), "waiting for proof: lookup found nothing; a negative lookup is trusted after ")
	})
	// (Relayed, or still pending when the runtime got the message before
	// the dispatcher marked it relayed: never terminal.)
	if rec.Status.Terminal() || len(d.calls()) != 1 {
		t.Fatalf("while waiting: %s, %d executions; want relayed, 1", adaptertest.Describe(rec), len(d.calls()))
	}
	if k := e.Key(t, "test", "k"); k == nil || k.State != idempotency.StateStarted || k.LastIOAt == nil {
		t.Fatalf("key while waiting = %+v; want started (owned) with its last I/O recorded", k)
	}
	if ev := findEvent(events(t, e.Env, id), idempotency.EventWaitingForProof); ev == nil || ev.from != ev.to || outbox.Status(ev.to).Terminal() || ev.note != adaptertest.LastError(rec) {
		t.Fatalf("history %+v; want a waiting_for_proof event with the message", events(t, e.Env, id))
	}
	rec = e.WaitStatus(t, id, outbox.StatusSucceeded)
	calls := d.calls()
	if len(calls) != 2 {
		t.Fatalf("executions = %d; want 2 (the first lost, the second after the window)", len(calls))
	}
	if gap := calls[1].start.Sub(calls[0].end); gap < settle {
		t.Fatalf("executed again %s after the first attempt's I/O ended; want no sooner than the settle window %s", gap, settle)
	}
	if rec.Attempts != 2 {
		t.Fatalf("attempts = %d, want 2 (waiting counts none)", rec.Attempts)
	}
}

// An attempt was abandoned (its process died) and its last I/O is unknown:
// the window is measured from the takeover, the latest moment it could have
// done I/O. Its lookup finds nothing; the effect is executed only a settle
// window after the takeover.
func TestAbandonedAttemptWaitsFromTakeover(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	const lock, settle = 300 * time.Millisecond, 1500 * time.Millisecond
	e := setupSlow(t, d, executor.Config{LookupSettle: settle}, lock)
	payload := json.RawMessage(`{"mode":"ok"}`)
	id := e.EnqueueHeldBack(t, e.Intent("test", "op", "k", payload))
	start := time.Now()
	if dec, err := e.Store.Begin(context.Background(), "test", "k", idempotency.Fingerprint("test", payload), id); err != nil || dec.Outcome != idempotency.OutcomeExecute {
		t.Fatalf("begin = %+v, %v", dec, err)
	}
	e.Release(t, id)
	e.WaitFor(t, id, "waiting for proof", func(r *outbox.Record) bool { return strings.HasPrefix(adaptertest.LastError(r), "waiting for proof") })
	if n := len(d.calls()); n != 0 {
		t.Fatalf("executed %d times while waiting", n)
	}
	e.WaitStatus(t, id, outbox.StatusSucceeded)
	calls := d.calls()
	if len(calls) != 1 {
		t.Fatalf("executions = %d, want 1", len(calls))
	}
	if after := calls[0].start.Sub(start); after < lock+settle {
		t.Fatalf("executed %s after the abandoned attempt began; want no sooner than its lock (%s) plus the settle window (%s)", after, lock, settle)
	}
}

// The wait survives a crash: the moment of the last I/O is on the key, so
// a runtime that takes over from a crashed one keeps waiting until the same
// deadline instead of starting a window of its own or trusting at once.
func TestWaitForProofSurvivesCrash(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.unknownTimes = 1
	const settle = 3 * time.Second
	e := adaptertest.NewEnv(t, adaptertest.Options{Kinds: testKinds, LockTimeout: 500 * time.Millisecond})
	cfg := executor.Config{LookupSettle: settle, ExecuteTimeout: time.Second, AckWait: 2 * time.Second}
	a := e.StartProcess(t, cfg, slowExec{d})
	id := e.Enqueue(t, e.Intent("test", "op", "k", json.RawMessage(`{"mode":"ok"}`)))
	e.WaitFor(t, id, "waiting for proof", func(r *outbox.Record) bool { return strings.HasPrefix(adaptertest.LastError(r), "waiting for proof") })
	k := e.Key(t, "test", "k")
	if k == nil || k.LastIOAt == nil {
		t.Fatalf("key = %+v; want the last I/O recorded", k)
	}
	a.Crash()
	e.StartRuntime(t, cfg, slowExec{d})
	e.WaitStatus(t, id, outbox.StatusSucceeded)
	calls := d.calls()
	if len(calls) != 2 {
		t.Fatalf("executions = %d; want 2", len(calls))
	}
	if gap := calls[1].start.Sub(calls[0].end); gap < settle {
		t.Fatalf("the second runtime executed %s after the first attempt's I/O; want no sooner than %s", gap, settle)
	}
}

// A lookup that cannot settle the key (found, Status unknown) holds the
// intent unknown, its effect possible, executed once: counted as held, not
// as recovered.
func TestLookupThatCannotSettleHolds(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.unknownTimes, d.effectOnUnknown, d.heldByLookup = 1, true, true
	e := setupSlow(t, d, executor.Config{MaxAttempts: 5}, 0)
	id := e.Enqueue(t, e.Intent("test", "op", "k", json.RawMessage(`{"mode":"ok"}`)))
	rec := e.WaitStatus(t, id, outbox.StatusUnknown)
	if rec.Effect != outbox.EffectPossible || len(d.calls()) != 1 {
		t.Fatalf("%s, effect %s, after %d executions; want unknown, effect possible, after 1", adaptertest.Describe(rec), rec.Effect, len(d.calls()))
	}
	held := counter(t, e.reg, "fencegate_adapter_outcomes_total", map[string]string{"kind": "test", "outcome": "held_by_lookup"})
	recovered := counter(t, e.reg, "fencegate_adapter_outcomes_total", map[string]string{"kind": "test", "outcome": "recovered_by_lookup"})
	if held != 1 || recovered != 0 {
		t.Errorf("outcomes counted: held_by_lookup %v, recovered_by_lookup %v; want 1 and 0", held, recovered)
	}
}

// lostAnswer runs one intent against d whose first attempt's answer is
// lost after the effect happened; lookups are retried fast and a negative
// one is never trusted (the settle window is an hour).
func lostAnswer(t *testing.T, d *slowDest) (slowEnv, int64) {
	t.Helper()
	d.unknownTimes, d.effectOnUnknown = 1, true
	e := setupSlow(t, d, executor.Config{LookupSettle: time.Hour, RetryBase: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond}, 0)
	return e, e.Enqueue(t, e.Intent("test", "op", "k", json.RawMessage(`{"mode":"ok"}`)))
}

// The answer of the first attempt is lost (the effect happened), and the
// lookup keeps failing (the lookup endpoint is down, or misconfigured):
// the intent waits, relayed, and says so — last_error names the failed
// lookup and its effect is possible — instead of staying relayed with no
// last_error and effect none for as long as the lookup fails. Once the
// lookup answers, it is recorded succeeded after one execution.
func TestFailingLookupSaysWhyTheIntentWaits(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.lookupFails = true
	e, id := lostAnswer(t, d)
	rec := e.WaitFor(t, id, "the failed lookup noted", func(r *outbox.Record) bool {
		return strings.Contains(adaptertest.LastError(r), "lookup endpoint answered 500")
	})
	if rec.Status.Terminal() || rec.Effect != outbox.EffectPossible || len(d.calls()) != 1 {
		t.Fatalf("while the lookup fails: %s, effect %s, %d executions; want relayed, effect possible, 1", adaptertest.Describe(rec), rec.Effect, len(d.calls()))
	}
	if !strings.HasPrefix(adaptertest.LastError(rec), "waiting for proof: ") {
		t.Errorf("last_error %q, want it to say the intent waits for proof", adaptertest.LastError(rec))
	}
	if ev := findEvent(events(t, e.Env, id), idempotency.EventWaitingForProof); ev == nil || ev.note != adaptertest.LastError(rec) {
		t.Errorf("history %+v; want a waiting_for_proof event with the message", events(t, e.Env, id))
	}
	d.mu.Lock()
	d.lookupFails = false
	d.mu.Unlock()
	rec = e.WaitStatus(t, id, outbox.StatusSucceeded)
	if !strings.Contains(string(rec.Result), "lookup") || len(d.calls()) != 1 {
		t.Fatalf("%s after %d executions; want found by lookup after 1", adaptertest.Describe(rec), len(d.calls()))
	}
}

// A lookup refused for good (a PermanentError from Lookup: the lookup
// endpoint refuses the credentials) can never settle the key: the intent
// is held unknown for an operator (effect possible, last_error naming the
// refusal), where it stayed relayed, looked up again and again, with no
// operator action that applies to it.
func TestRefusedLookupHoldsTheIntent(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.lookupRefused = true
	e, id := lostAnswer(t, d)
	rec := e.WaitStatus(t, id, outbox.StatusUnknown)
	if rec.Effect != outbox.EffectPossible || len(d.calls()) != 1 || !strings.Contains(adaptertest.LastError(rec), "lookup endpoint answered 401") {
		t.Fatalf("%s, effect %s, after %d executions; want held unknown, effect possible, naming the refused lookup, after 1",
			adaptertest.Describe(rec), rec.Effect, len(d.calls()))
	}
	// The attempt history says so: the refusing lookup's attempt ended
	// unknown (a lookup_failed row recorded first took its place).
	if got := testdb.Int(t, e.Pool, `SELECT count(*) FROM fencegate.intent_attempts WHERE intent_id = $1 AND outcome = 'unknown'
		AND error LIKE '%lookup endpoint answered 401%'`, id); got != 1 {
		t.Fatalf("%d unknown attempts naming the refusal in the history, want 1", got)
	}
}

// A positive lookup is trusted at once, however long the window.
func TestPositiveLookupTrustedAtOnce(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.unknownTimes, d.effectOnUnknown = 1, true
	e := setupSlow(t, d, executor.Config{LookupSettle: time.Hour}, 0)
	id := e.Enqueue(t, e.Intent("test", "op", "k", json.RawMessage(`{"mode":"ok"}`)))
	rec := e.WaitStatus(t, id, outbox.StatusSucceeded)
	if !strings.Contains(string(rec.Result), "lookup") || len(d.calls()) != 1 {
		t.Fatalf("%s after %d executions; want found by lookup after 1", adaptertest.Describe(rec), len(d.calls()))
	}
}

// StillOwner, as the runtime builds it, fails once the key was taken over.
type checkingExec struct {
	slowExec
	checked chan error
}

func (e checkingExec) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	e.d.hold()
	err := req.StillOwner(ctx)
	e.checked <- err
	if err != nil {
		return adapters.Outcome{}, adapters.RetryableError(err)
	}
	return e.slowExec.Execute(ctx, req)
}

func TestStillOwnerFailsAfterTakeover(t *testing.T) {
	t.Parallel()
	d := newSlowDest()
	d.gate = make(chan struct{})
	const lock = 300 * time.Millisecond
	ex := checkingExec{slowExec{d}, make(chan error, 4)}
	e := adaptertest.NewEnv(t, adaptertest.Options{Executors: []adapters.Executor{ex}, Kinds: testKinds, LockTimeout: lock})
	t.Cleanup(d.open)
	payload := json.RawMessage(`{"mode":"ok"}`)
	id := e.Enqueue(t, e.Intent("test", "op", "k", payload))
	waitChan(t, d.entered, "the attempt to start executing")
	takeOver(t, e, id, payload, lock)
	d.open()
	select {
	case err := <-ex.checked:
		if !errors.Is(err, adapters.ErrNotOwner) || !errors.Is(err, idempotency.ErrLostOwnership) {
			t.Fatalf("StillOwner after the takeover: %v; want ErrNotOwner (lost ownership)", err)
		}
	case <-time.After(adaptertest.WaitTimeout):
		t.Fatal("Execute never checked")
	}
	if n := len(d.calls()); n != 0 {
		t.Fatalf("the effect ran %d times after a failed owner check", n)
	}
}
