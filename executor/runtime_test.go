package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/otelsetup"
	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// destination is a fake external system at the edge of the world: it
// records every effect per idempotency key, and can be told to fail.
type destination struct {
	mu      sync.Mutex
	effects map[string]int // key → times executed
	calls   int
	// behave decides an Execute's result from its payload's "mode".
	lookup bool
	dedups bool
}

type testExec struct{ d *destination }

func (e testExec) Kind() string { return "test" }

// kindExec is testExec serving another kind.
type kindExec struct {
	testExec
	kind string
}

func (e kindExec) Kind() string { return e.kind }

func (e testExec) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return adapters.Outcome{}, adapters.RetryableError(err)
	}
	var p struct {
		Mode      string `json:"mode"`
		FailTimes int    `json:"fail_times"`
	}
	if err := json.Unmarshal(req.Payload, &p); err != nil {
		return adapters.Outcome{}, adapters.PermanentError(err)
	}
	e.d.mu.Lock()
	defer e.d.mu.Unlock()
	e.d.calls++
	switch p.Mode {
	case "retry":
		if req.Attempt <= p.FailTimes {
			return adapters.Outcome{}, adapters.RetryableError(fmt.Errorf("try again (attempt %d)", req.Attempt))
		}
	case "permanent":
		return adapters.Outcome{}, adapters.PermanentError(errors.New("mailbox does not exist"))
	case "plain":
		// What an adapter author writes on a connection reset: a plain
		// error, not classified — after the request reached the
		// destination (the effect happened).
		e.d.effects[req.IdempotencyKey]++
		return adapters.Outcome{}, fmt.Errorf("post: %w", errors.New("connection reset by peer"))
	case "bad-result":
		// The effect happens; the result is not a JSON object (an adapter
		// bug that adaptertest's ExecuteReturnsJSONObject catches).
		e.d.effects[req.IdempotencyKey]++
		return adapters.Outcome{Status: outbox.StatusSucceeded, Result: json.RawMessage("not json")}, nil
	case "array-result":
		e.d.effects[req.IdempotencyKey]++
		return adapters.Outcome{Status: outbox.StatusSucceeded, Result: json.RawMessage(`[1,2]`)}, nil
	case "failed-status":
		// The effect happens; the adapter reports "failed" with no error,
		// a status Execute may not return.
		e.d.effects[req.IdempotencyKey]++
		return adapters.Outcome{Status: outbox.StatusFailed}, nil
	case "panic":
		// The effect happens, then the adapter panics.
		e.d.effects[req.IdempotencyKey]++
		panic("adapter bug")
	case "lookup-bad-status":
		// The effect happens, the answer is lost; the lookup then finds
		// it, but reports a status a lookup may not return.
		e.d.effects[req.IdempotencyKey]++
		return adapters.Outcome{}, adapters.UnknownError(errors.New("connection dropped after the effect"))
	case "lost-response":
		// The effect happens, the answer is lost.
		if e.d.effects[req.IdempotencyKey] == 0 {
			e.d.effects[req.IdempotencyKey]++
			return adapters.Outcome{}, adapters.UnknownError(errors.New("connection dropped after the effect"))
		}
	}
	e.d.effects[req.IdempotencyKey]++
	res, _ := json.Marshal(map[string]any{"key": req.IdempotencyKey, "n": e.d.effects[req.IdempotencyKey]})
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: res}, nil
}

func (e testExec) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{Lookup: e.d.lookup, DedupsOnKey: e.d.dedups}
}

func (e testExec) Lookup(ctx context.Context, req adapters.Request) (adapters.Outcome, bool, error) {
	e.d.mu.Lock()
	defer e.d.mu.Unlock()
	if e.d.effects[req.IdempotencyKey] == 0 {
		return adapters.Outcome{}, false, nil
	}
	if strings.Contains(string(req.Payload), `"lookup-bad-status"`) {
		return adapters.Outcome{Status: outbox.StatusRelayed}, true, nil
	}
	res, _ := json.Marshal(map[string]any{"key": req.IdempotencyKey, "found_by": "lookup"})
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: res}, true, nil
}

func (d *destination) count(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.effects[key]
}

type env struct {
	*adaptertest.Env
	dest *destination
}

type opts struct {
	lookup, dedups bool
	unknown        executor.UnknownPolicy
	lockTimeout    time.Duration
	// settle is the runtime's LookupSettle (zero: its default).
	settle time.Duration
	// logs, when set, receives the runtime's log (text, debug and up).
	logs *toolbin.SyncBuffer
	// jsonLogs: logs are JSON lines through otelsetup's LogHandler, as
	// gateway run --log-format json writes them.
	jsonLogs bool
}

var testKinds = map[string]outbox.KindSpec{"test": {DefaultFence: outbox.FenceCommit}}

func setup(t *testing.T, o opts) *env {
	t.Helper()
	dest := &destination{effects: map[string]int{}, lookup: o.lookup, dedups: o.dedups}
	var logger *slog.Logger
	if o.logs != nil {
		logger = slog.New(slog.NewTextHandler(o.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		if o.jsonLogs {
			logger = slog.New(otelsetup.NewLogHandler(slog.NewJSONHandler(o.logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
		}
	}
	e := adaptertest.NewEnv(t, adaptertest.Options{
		Executors:   []adapters.Executor{testExec{dest}},
		Kinds:       testKinds,
		Runtime:     executor.Config{MaxAttempts: 3, Unknown: o.unknown, LookupSettle: o.settle, Logger: logger},
		LockTimeout: o.lockTimeout,
	})
	return &env{Env: e, dest: dest}
}

func (e *env) enqueue(t *testing.T, op, key, payload string) int64 {
	t.Helper()
	return e.Enqueue(t, e.Intent("test", op, key, json.RawMessage(payload)))
}

func (e *env) waitTerminal(t *testing.T, id int64) *outbox.Record {
	t.Helper()
	return e.WaitTerminal(t, id)
}

// wantEnd waits for intent id to end and checks its status and how many
// times the destination took key's effect.
func (e *env) wantEnd(t *testing.T, id int64, status outbox.Status, key string, effects int) *outbox.Record {
	t.Helper()
	rec := e.waitTerminal(t, id)
	if rec.Status != status {
		t.Fatalf("record = %+v; want %s", rec, status)
	}
	if n := e.dest.count(key); n != effects {
		t.Fatalf("effects of %q = %d, want %d", key, n, effects)
	}
	return rec
}

// wantFoundByLookup waits for intent id to end and checks that a lookup
// found its effect: succeeded, found_by lookup, the effect of key once.
func (e *env) wantFoundByLookup(t *testing.T, id int64, key string) {
	t.Helper()
	rec := e.wantEnd(t, id, outbox.StatusSucceeded, key, 1)
	var res map[string]any
	_ = json.Unmarshal(rec.Result, &res)
	if res["found_by"] != "lookup" {
		t.Fatalf("result %s; want found by lookup", rec.Result)
	}
}

// TestConformance runs the adapter conformance suite against the test
// executor, which checks the suite as much as the runtime.
func TestConformance(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	dests := map[*testing.T]*destination{}
	adaptertest.Run(t, adaptertest.Harness{
		New: func(t *testing.T) adapters.Executor {
			d := &destination{effects: map[string]int{}, lookup: true}
			mu.Lock()
			dests[t] = d
			mu.Unlock()
			return testExec{d}
		},
		Payload: func(i int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"mode":"ok","i":%d}`, i)) },
		Effects: func(t *testing.T, req adapters.Request) int {
			mu.Lock()
			d := dests[t]
			mu.Unlock()
			return d.count(req.IdempotencyKey)
		},
		HasLookup: true,
		Kinds:     testKinds,
	})
}

func TestExecutesOnceAndRecords(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{lookup: true})
	rec := e.wantEnd(t, e.enqueue(t, "op-1", "k-1", `{"mode":"ok"}`), outbox.StatusSucceeded, "k-1", 1)
	if rec.Attempts != 1 || rec.CompletedAt == nil {
		t.Fatalf("record = %+v", rec)
	}
	var res map[string]any
	if err := json.Unmarshal(rec.Result, &res); err != nil || res["key"] != "k-1" {
		t.Fatalf("result = %s", rec.Result)
	}
}

// A second intent with the same business key (another epoch, another
// worker) gets the stored result; no second effect.
func TestSameBusinessKeyAcrossEpochsExecutesOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{lookup: true})
	first := e.enqueue(t, "A-run", "report/2026-12-01/alice", `{"mode":"ok"}`)
	r1 := e.waitTerminal(t, first)
	// B takes over and re-runs the job.
	e.Advance(t, e.Epoch()+1)
	second := e.enqueue(t, "B-run", "report/2026-12-01/alice", `{"mode":"ok"}`)
	r2 := e.waitTerminal(t, second)
	if r2.Status != outbox.StatusSucceeded || string(r2.Result) != string(r1.Result) {
		t.Fatalf("second intent = %s %s; want succeeded with the stored result %s", r2.Status, r2.Result, r1.Result)
	}
	if n := e.dest.count("report/2026-12-01/alice"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	// Same key, different content: conflict, never executed.
	third := e.enqueue(t, "C-run", "report/2026-12-01/alice", `{"mode":"ok","extra":1}`)
	r3 := e.waitTerminal(t, third)
	if r3.Status != outbox.StatusFailed || r3.LastError == nil {
		t.Fatalf("conflicting intent = %+v; want failed with a reason", r3)
	}
	if n := e.dest.count("report/2026-12-01/alice"); n != 1 {
		t.Fatalf("effects after conflict = %d, want 1", n)
	}
}

// Retryable errors are retried up to MaxAttempts (3), a permanent one is
// not. A failed intent never had its effect; when retries ran out its key
// is released, so an operator's retry would execute again.
func TestAttemptsEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, payload     string
		status            outbox.Status
		attempts, effects int
		released          bool
	}{
		{"retryable then succeeds", `{"mode":"retry","fail_times":2}`, outbox.StatusSucceeded, 3, 1, false},
		{"retryable exhausted fails", `{"mode":"retry","fail_times":99}`, outbox.StatusFailed, 3, 0, true},
		{"permanent fails", `{"mode":"permanent"}`, outbox.StatusFailed, 1, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, opts{})
			rec := e.wantEnd(t, e.enqueue(t, "op", "k", tc.payload), tc.status, "k", tc.effects)
			if rec.Attempts != tc.attempts {
				t.Fatalf("record = %+v; want %s after %d attempts", rec, tc.status, tc.attempts)
			}
			if tc.status == outbox.StatusFailed && rec.LastError == nil {
				t.Fatalf("record = %+v; want failed with the reason", rec)
			}
			if _, err := e.Store.Get(context.Background(), "test", "k"); tc.released && !errors.Is(err, idempotency.ErrNotFound) {
				t.Fatalf("key after exhausted retries: %v; want released", err)
			}
		})
	}
}

// wantHeld enqueues an intent (op, key k) whose Execute does mode and
// waits until it is held unknown for an operator, after one attempt:
// effect possible, last_error containing lastErr, its key held.
func (e *env) wantHeld(t *testing.T, mode, lastErr string) *outbox.Record {
	t.Helper()
	rec := e.wantEnd(t, e.enqueue(t, "op", "k", `{"mode":"`+mode+`"}`), outbox.StatusUnknown, "k", 1)
	if rec.Effect != outbox.EffectPossible || rec.LastError == nil || !strings.Contains(*rec.LastError, lastErr) {
		t.Fatalf("record = %+v; want effect possible, last_error containing %q", rec, lastErr)
	}
	if k := e.Key(t, "test", "k"); k.State != idempotency.StateHeld {
		t.Fatalf("key state %s, want held", k.State)
	}
	return rec
}

// An outcome the executor cannot take as a failure is an unknown outcome,
// never a permanent failure: the key was begun and the effect may have
// happened (here it did). Without a lookup the intent is held unknown (its
// key held, nothing executed again, last_error saying why); with one it is
// looked up, found and recorded as succeeded — one effect either way.
//   - plain: an error the executor did not classify;
//   - failed-status: an Outcome whose Status Execute may not return
//     (failed, with no error), an adapter bug. It was recorded failed,
//     effect none.
func TestUnclassifiedOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ mode, lastErr string }{
		{"plain", "connection reset"},
		{"failed-status", `adapter bug: Execute returned status "failed" and no error`},
	} {
		t.Run(tc.mode+"/no lookup: held", func(t *testing.T) {
			t.Parallel()
			e := setup(t, opts{})
			e.wantHeld(t, tc.mode, tc.lastErr)
		})
		t.Run(tc.mode+"/lookup: recovered", func(t *testing.T) {
			t.Parallel()
			e := setup(t, opts{lookup: true})
			e.wantFoundByLookup(t, e.enqueue(t, "op", "k", `{"mode":"`+tc.mode+`"}`), "k")
		})
	}
}

// An adapter's result that is not a JSON object, after the effect
// happened, is recorded at once as the adapter reported the effect
// (succeeded), the result replaced by an object saying what it was and
// last_error naming the adapter bug. It was refused when recorded, so the
// intent stayed relayed with effect none until the key's lock expired and
// was then held as "abandoned".
func TestBadResultRecordedAsReported(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ mode, invalid string }{
		{"bad-result", "not json"},
		{"array-result", "[1,2]"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			var logs toolbin.SyncBuffer
			e := setup(t, opts{logs: &logs})
			rec := e.wantEnd(t, e.enqueue(t, "op", "k", `{"mode":"`+tc.mode+`"}`), outbox.StatusSucceeded, "k", 1)
			if out := logs.String(); !strings.Contains(out, `level=ERROR msg="adapters: adapter bug: Execute returned a result that is not a JSON object`) {
				t.Fatalf("no ERROR naming the adapter bug in the log:\n%s", out)
			}
			var res map[string]any
			if err := json.Unmarshal(rec.Result, &res); err != nil || res["invalid_result"] != tc.invalid {
				t.Fatalf("result = %s; want an object with invalid_result %q", rec.Result, tc.invalid)
			}
			if rec.Effect != outbox.EffectDone || rec.LastError == nil || !strings.Contains(*rec.LastError, "adapter bug: Execute returned a result that is not a JSON object") {
				t.Fatalf("record = %+v; want effect done, last_error naming the adapter bug", rec)
			}
			if k := e.Key(t, "test", "k"); k.State != idempotency.StateCompleted || k.Status != outbox.StatusSucceeded {
				t.Fatalf("key = %+v; want completed succeeded", k)
			}
		})
	}
}

// A lookup that finds the effect but reports a status a lookup may not
// return (relayed) is an adapter bug: the intent is held unknown, effect
// possible, last_error naming it, at once. The store refused the status
// when it was recorded, so the intent stayed relayed and the key owned
// until its lock expired.
func TestLookupBadStatusIsHeld(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{lookup: true})
	e.wantHeld(t, "lookup-bad-status", `adapter bug: Lookup returned status "relayed"`)
}

// A panic in an adapter's Execute is recovered by the runtime and taken
// as an unknown outcome (the key was begun): held, last_error "adapter
// panicked: <value>", without a lookup; looked up and found with one. The
// runtime goes on: the next intent executes. It killed the process.
func TestExecutePanicIsUnknown(t *testing.T) {
	t.Parallel()
	t.Run("no lookup: held", func(t *testing.T) {
		t.Parallel()
		var logs toolbin.SyncBuffer
		e := setup(t, opts{logs: &logs})
		e.wantHeld(t, "panic", "adapter panicked: adapter bug")
		if out := logs.String(); !strings.Contains(out, `level=ERROR msg="adapters: the executor's Execute panicked`) || !strings.Contains(out, "stack=") {
			t.Fatalf("no ERROR with the panic's stack in the log:\n%s", out)
		}
		e.wantEnd(t, e.enqueue(t, "op2", "k2", `{"mode":"ok"}`), outbox.StatusSucceeded, "k2", 1)
	})
	t.Run("lookup: recovered", func(t *testing.T) {
		t.Parallel()
		e := setup(t, opts{lookup: true})
		e.wantFoundByLookup(t, e.enqueue(t, "op", "k", `{"mode":"panic"}`), "k")
	})
}

// Lost response, destination with lookup: the effect is found and recorded,
// not repeated.
func TestUnknownOutcomeResolvedByLookup(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{lookup: true})
	e.wantFoundByLookup(t, e.enqueue(t, "op", "k", `{"mode":"lost-response"}`), "k")
}

// Lost response, no lookup, policy hold: unknown, never re-executed.
func TestUnknownOutcomeHeld(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{unknown: executor.UnknownHold})
	e.wantEnd(t, e.enqueue(t, "op", "k", `{"mode":"lost-response"}`), outbox.StatusUnknown, "k", 1)
	k, err := e.Store.Get(context.Background(), "test", "k")
	if err != nil || k.State != idempotency.StateHeld {
		t.Fatalf("key = %+v, %v; want held", k, err)
	}
	// Another intent with the same key is not executed either (no resend).
	e.wantEnd(t, e.enqueue(t, "op2", "k", `{"mode":"lost-response"}`), outbox.StatusUnknown, "k", 1)
}

// Policy resend, but the destination does not dedup on our key: held anyway.
func TestResendOnlyWhereDestinationDedups(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{unknown: executor.UnknownResend, dedups: false})
	id := e.enqueue(t, "op", "k", `{"mode":"lost-response"}`)
	if rec := e.waitTerminal(t, id); rec.Status != outbox.StatusUnknown {
		t.Fatalf("status = %s, want unknown", rec.Status)
	}
	e2 := setup(t, opts{unknown: executor.UnknownResend, dedups: true})
	id = e2.enqueue(t, "op", "k", `{"mode":"lost-response"}`)
	if rec := e2.waitTerminal(t, id); rec.Status != outbox.StatusSucceeded {
		t.Fatalf("status with a deduping destination = %s, want succeeded after resend", rec.Status)
	}
}

// A crash between the effect and its record: an earlier attempt owns the key
// and never completes. After its lock expires the redelivery looks the
// outcome up and records it; the effect is not repeated.
func TestAbandonedAttemptRecoveredByLookup(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{lookup: true, lockTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	// The crashed attempt: it began on the key, performed the effect, and
	// died before Complete.
	id := e.EnqueueHeldBack(t, e.Intent("test", "op", "k2", json.RawMessage(`{"mode":"ok"}`)))
	d, err := e.Store.Begin(ctx, "test", "k2", idempotency.Fingerprint("test", []byte(`{"mode":"ok"}`)), id)
	if err != nil || d.Outcome != idempotency.OutcomeExecute {
		t.Fatalf("begin = %+v, %v", d, err)
	}
	e.dest.mu.Lock()
	e.dest.effects["k2"]++
	e.dest.mu.Unlock()
	e.Release(t, id)
	e.wantFoundByLookup(t, id, "k2")
}

// Fence policy execute: when the resource moved on before execution, the
// intent is superseded and never executed.
func TestExecuteFenceSupersedes(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{})
	id := e.EnqueueHeldBack(t, withFence(e.Intent("test", "op", "k", json.RawMessage(`{"mode":"ok"}`)), outbox.FenceExecute))
	e.Advance(t, e.Epoch()+1)
	e.Release(t, id)
	e.wantEnd(t, id, outbox.StatusSuperseded, "k", 0)
	// Fence commit: executed although the resource moved on (it was
	// decided while its epoch was current).
	id2 := e.EnqueueHeldBack(t, withFence(e.Intent("test", "op2", "k2", json.RawMessage(`{"mode":"ok"}`)), outbox.FenceCommit))
	e.Advance(t, e.Epoch()+1)
	e.Release(t, id2)
	e.wantEnd(t, id2, outbox.StatusSucceeded, "k2", 1)
}

// The execute fence's epochs of concurrent deliveries are read in one
// statement per batch (epochBatch): in a batch of intents of two resources
// released together, those of the resource that moved on are superseded
// and never executed, those of the other succeed, each by its own
// resource's epoch.
func TestExecuteFenceEpochsOfABatch(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{})
	ctx := context.Background()
	other := e.Resource + "-other"
	if _, err := e.Issuer.Advance(ctx, other, 7); err != nil {
		t.Fatal(err)
	}
	const per = 12
	var moved, kept []int64
	for i := range per {
		moved = append(moved, e.EnqueueHeldBack(t, withFence(e.Intent("test", fmt.Sprintf("m-%d", i), fmt.Sprintf("m-%d", i), json.RawMessage(`{"mode":"ok"}`)), outbox.FenceExecute)))
		in := withFence(e.Intent("test", fmt.Sprintf("k-%d", i), fmt.Sprintf("k-%d", i), json.RawMessage(`{"mode":"ok"}`)), outbox.FenceExecute)
		in.Resource, in.Epoch = other, 7
		kept = append(kept, e.EnqueueHeldBack(t, in))
	}
	e.Advance(t, e.Epoch()+1)
	for i := range per {
		e.Release(t, moved[i])
		e.Release(t, kept[i])
	}
	for i := range per {
		e.wantEnd(t, moved[i], outbox.StatusSuperseded, fmt.Sprintf("m-%d", i), 0)
		e.wantEnd(t, kept[i], outbox.StatusSucceeded, fmt.Sprintf("k-%d", i), 1)
	}
}

// Redelivery of a message whose intent is already terminal: acked, nothing
// executed again.
func TestRedeliveryOfTerminalIntentIsSkipped(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{})
	id := e.enqueue(t, "op", "k", `{"mode":"ok"}`)
	e.waitTerminal(t, id)
	// Force a re-relay: back to relayed with an old relayed_at.
	e.Rerelay(t, id)
	// The key is completed, so even the redelivered intent gets Done.
	e.wantEnd(t, id, outbox.StatusSucceeded, "k", 1)
}

func withFence(in outbox.Intent, f outbox.Fence) outbox.Intent {
	in.Fence = f
	return in
}

// Fence policy execute, and an earlier attempt of the intent was abandoned
// before the resource moved on: the runtime never executes it again, but
// asks before calling it superseded — the abandoned attempt may have
// performed the effect (see adapters/file's TestRuntimeCrashThenResourceMovesOn
// for the found case).
func TestExecuteFenceAfterAbandonedAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		lookup bool
		want   outbox.Status
	}{
		{"lookup finds nothing: superseded", true, outbox.StatusSuperseded},
		{"no lookup: unknown", false, outbox.StatusUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A short settle window: the abandoned attempt's lookup that
			// finds nothing becomes proof soon after the takeover.
			e := setup(t, opts{lookup: tc.lookup, lockTimeout: 300 * time.Millisecond, settle: 500 * time.Millisecond})
			ctx := context.Background()
			id := e.EnqueueHeldBack(t, withFence(e.Intent("test", "op", "k", json.RawMessage(`{"mode":"ok"}`)), outbox.FenceExecute))
			if d, err := e.Store.Begin(ctx, "test", "k", idempotency.Fingerprint("test", []byte(`{"mode":"ok"}`)), id); err != nil || d.Outcome != idempotency.OutcomeExecute {
				t.Fatalf("begin = %+v, %v", d, err)
			}
			e.Advance(t, e.Epoch()+1)
			e.Release(t, id)
			rec := e.WaitStatus(t, id, tc.want)
			e.dest.mu.Lock()
			calls := e.dest.calls
			e.dest.mu.Unlock()
			if n := e.dest.count("k"); n != 0 || calls != 0 {
				t.Fatalf("effects %d, calls %d; want none (%s)", n, calls, adaptertest.Describe(rec))
			}
			k := e.Key(t, "test", "k")
			switch tc.want {
			case outbox.StatusSuperseded:
				if k != nil {
					t.Fatalf("key = %+v; want deleted", k)
				}
			case outbox.StatusUnknown:
				if k == nil || k.State != idempotency.StateHeld {
					t.Fatalf("key = %+v; want held", k)
				}
			}
		})
	}
}

// boundedExec declares Capabilities.Concurrency and records the most
// Execute calls it saw at once; each call takes a while, as a destination
// does.
type boundedExec struct {
	limit        int
	mu           sync.Mutex
	inside, most int
	done         map[string]bool
}

func (e *boundedExec) Kind() string { return "test" }

func (e *boundedExec) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{Concurrency: e.limit}
}

func (e *boundedExec) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	e.mu.Lock()
	e.inside++
	e.most = max(e.most, e.inside)
	e.mu.Unlock()
	select {
	case <-time.After(20 * time.Millisecond): // the destination's latency
	case <-ctx.Done():
	}
	e.mu.Lock()
	e.inside--
	e.done[req.IdempotencyKey] = true
	e.mu.Unlock()
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: json.RawMessage(`{}`)}, nil
}

// An executor's declared Concurrency bounds its executions below the
// runtime's (much higher) Config.Concurrency.
func TestDeclaredConcurrencyBounds(t *testing.T) {
	t.Parallel()
	ex := &boundedExec{limit: 2, done: map[string]bool{}}
	e := adaptertest.NewEnv(t, adaptertest.Options{
		Executors: []adapters.Executor{ex},
		Kinds:     testKinds,
		Runtime:   executor.Config{Concurrency: 64},
	})
	var ids []int64
	for i := range 16 {
		ids = append(ids, e.Enqueue(t, e.Intent("test", fmt.Sprintf("op-%d", i), fmt.Sprintf("k-%d", i), json.RawMessage(`{}`))))
	}
	for _, id := range ids {
		if rec := e.WaitTerminal(t, id); rec.Status != outbox.StatusSucceeded {
			t.Fatalf("intent %d: %+v", id, rec)
		}
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.most > 2 || ex.most < 1 {
		t.Fatalf("at most %d executions at once, want 1-2 (declared Concurrency 2)", ex.most)
	}
}

// The shared transactions of group commit and the dispatcher's writes to
// the same intents (the mark after each PubAck, which adapters race with)
// lock rows in one order: no shared transaction fails, on a deadlock or
// otherwise, while a burst is relayed and settled at once.
func TestGroupCommitNoDeadlockWithRelay(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{})
	ctx := context.Background()
	const batches, per = 100, 100
	var ids []int64
	for b := range batches {
		var in []outbox.Intent
		for i := range per {
			n := b*per + i
			in = append(in, e.Intent("test", fmt.Sprintf("op-%d", n), fmt.Sprintf("k-%d", n), json.RawMessage(`{"mode":"ok"}`)))
		}
		res, err := e.Client.EnqueueBatch(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			ids = append(ids, r.IntentID)
		}
	}
	for _, id := range ids {
		if rec := e.WaitTerminal(t, id); rec.Status != outbox.StatusSucceeded {
			t.Fatalf("intent %d: %+v", id, rec)
		}
	}
	if n := e.Store.GroupFailures(); n != 0 {
		t.Fatalf("%d shared transactions failed (see the log: a deadlock with the dispatcher's mark?)", n)
	}
}

// The runtime's lifecycle (internal/startstop): a second Start is an error,
// Stop waits and closes Stopped, a Stop again returns at once.
func TestRuntimeLifecycle(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{})
	if err := e.Runtime.Start(context.Background()); !errors.Is(err, startstop.ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
	e.Runtime.Stop()
	<-e.Runtime.Stopped()
	e.Runtime.Stop()
}

// A bad setting is refused by Validate naming the field, prefixed by the
// package that refuses it (it said "adapters: ").
func TestConfigValidateNamesThePackage(t *testing.T) {
	t.Parallel()
	err := executor.Config{MaxAttempts: -1}.Validate()
	if want := "executor: MaxAttempts: must be at least 1"; err == nil || err.Error() != want {
		t.Fatalf("Validate = %v, want %q", err, want)
	}
}

// A Config the runtime refuses names the field: a Schema that is not the
// outbox client's, a KeyLockTimeout that is not the store's.
func TestNewRuntimeConfigErrors(t *testing.T) {
	t.Parallel()
	e := setup(t, opts{})
	for _, c := range []struct {
		field string
		cfg   executor.Config
	}{
		{"Schema", executor.Config{Schema: "elsewhere"}},
		{"KeyLockTimeout", executor.Config{KeyLockTimeout: e.Store.Config().LockTimeout + time.Second}},
		// A nil executor, and a kind that is no NATS token (its consumer
		// could never be made).
		{"Executors", executor.Config{Executors: []adapters.Executor{nil}}},
		{"Executors", executor.Config{Executors: []adapters.Executor{kindExec{testExec{e.dest}, "a.b"}}}},
	} {
		field, cfg := c.field, c.cfg
		if cfg.Executors == nil {
			cfg.Executors = []adapters.Executor{testExec{e.dest}}
		}
		_, err := executor.NewRuntime(e.Pool, e.NC, e.Store, e.Client, cfg)
		var inv *fenceerr.InvalidError
		if !errors.As(err, &inv) || inv.Field != field {
			t.Errorf("NewRuntime(%+v) = %v, want an InvalidError naming %s", cfg, err, field)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "executor: "+field+": ") {
			t.Errorf("NewRuntime(%+v) = %q, want it prefixed by its package, executor", cfg, err)
		}
	}
	// A missing argument is refused when the runtime is made, naming it,
	// not met as a nil pointer by the first message.
	cfg := executor.Config{Executors: []adapters.Executor{testExec{e.dest}}}
	coretest.Refused(t, map[string]func() error{
		"pool":  func() error { _, err := executor.NewRuntime(nil, e.NC, e.Store, e.Client, cfg); return err },
		"nc":    func() error { _, err := executor.NewRuntime(e.Pool, nil, e.Store, e.Client, cfg); return err },
		"store": func() error { _, err := executor.NewRuntime(e.Pool, e.NC, nil, e.Client, cfg); return err },
		"ob":    func() error { _, err := executor.NewRuntime(e.Pool, e.NC, e.Store, nil, cfg); return err },
	})
}

// gatedExec is a "test" executor whose executions wait at a gate: started
// receives one value an execution, each returns once gate is closed.
type gatedExec struct {
	started chan struct{}
	gate    chan struct{}
}

func (gatedExec) Kind() string                        { return "test" }
func (gatedExec) Capabilities() adapters.Capabilities { return adapters.Capabilities{} }
func (g gatedExec) Execute(ctx context.Context, _ adapters.Request) (adapters.Outcome, error) {
	g.started <- struct{}{}
	<-g.gate
	return adapters.Outcome{}, nil
}

// Executions that finish while NATS is away record their outcomes and
// fail their acks: said once (a WARN, then DEBUG), not once a message
// (128 WARN lines for a 5 s NATS outage in the soak audit).
func TestAckFailuresAreLoggedOnce(t *testing.T) {
	t.Parallel()
	e := adaptertest.NewEnv(t, adaptertest.Options{Kinds: testKinds})
	var logs toolbin.SyncBuffer
	g := gatedExec{started: make(chan struct{}, 8), gate: make(chan struct{})}
	p := e.StartProcess(t, executor.Config{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}, g)
	const n = 5
	var ids []int64
	for i := range n {
		ids = append(ids, e.Enqueue(t, e.Intent("test", fmt.Sprintf("ack-%d", i), fmt.Sprintf("ack-%d", i), json.RawMessage(`{}`))))
	}
	for range n {
		select {
		case <-g.started:
		case <-time.After(30 * time.Second):
			t.Fatal("executions did not start")
		}
	}
	p.NC.Close() // NATS away for this process; PostgreSQL stays
	close(g.gate)
	for _, id := range ids {
		if r := e.WaitTerminal(t, id); r.Status != outbox.StatusSucceeded {
			t.Fatalf("intent %d: %s, want succeeded", id, r.Status)
		}
	}
	var failed, warned int
	deadline := time.Now().Add(10 * time.Second)
	for {
		log := logs.String()
		failed = strings.Count(log, `msg="adapters: ack failed`)
		warned = strings.Count(log, `level=WARN msg="adapters: ack failed`)
		if failed == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d executions recorded with NATS away: %d failed acks logged, %d at WARN", n, failed, warned)
	if failed != n || warned != 1 {
		t.Errorf("%d failed acks logged, %d at WARN; want %d, 1:\n%s", failed, warned, n, logs.String())
	}
}

// An unknown outcome is said once at WARN, by what the runtime does with
// it (holds it for an operator, resends with the key later), not also by
// a line before that says only "outcome unknown" (two lines, each with
// the error, for every unknown outcome in the soak audit).
func TestUnknownOutcomeIsOneWarning(t *testing.T) {
	checked := 0
	for _, tc := range []struct {
		name string
		o    opts
		want string
	}{
		{"held", opts{}, "adapters: outcome unknown and cannot be looked up; holding for an operator"},
		{"resent with the key", opts{dedups: true, unknown: executor.UnknownResend}, "adapters: the effect may have happened; keeping the key and retrying with it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs toolbin.SyncBuffer
			tc.o.logs = &logs
			e := setup(t, tc.o)
			id := e.enqueue(t, "unknown-once", "unknown-once", `{"mode":"lost-response"}`)
			e.waitTerminal(t, id)
			var warns []string
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, "level=WARN") && strings.Contains(l, fmt.Sprintf("intent_id=%d ", id)) {
					warns = append(warns, l)
				}
			}
			if len(warns) != 1 || !strings.Contains(warns[0], tc.want) {
				t.Fatalf("WARN lines of intent %d: %q; want one, %q", id, warns, tc.want)
			}
			checked++
		})
	}
	t.Logf("%d unknown outcomes said in one WARN line each", checked)
	if checked != 2 {
		t.Fatalf("%d of 2 cases checked", checked)
	}
}
