package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/outbox"
)

// scripted is a destination at the edge of the world whose answers are a
// script per attempt: "unknown" (it acts, then the answer is lost),
// "refused" (nothing sent: retryable), "permanent" (refused for good,
// nothing done), "lost" (nothing done, and the answer is lost: the
// outcome looks unknown), "ok" (done). It records the effects per key and
// every attempt's number.
type scripted struct {
	mu       sync.Mutex
	effects  map[string]int
	attempts []int
	script   []string
	lookup   bool
	dedups   bool
}

func (s *scripted) Kind() string { return "test" }

func (s *scripted) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{Lookup: s.lookup, DedupsOnKey: s.dedups, LookupSettle: 300 * time.Millisecond}
}

func (s *scripted) Execute(_ context.Context, req adapters.Request) (adapters.Outcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts = append(s.attempts, req.Attempt)
	step := "ok"
	if n := len(s.attempts); n <= len(s.script) {
		step = s.script[n-1]
	}
	switch step {
	case "unknown":
		s.effects[req.IdempotencyKey]++
		return adapters.Outcome{}, adapters.UnknownError(errors.New("connection dropped after the request"))
	case "lost":
		return adapters.Outcome{}, adapters.UnknownError(errors.New("connection dropped, the request never arrived"))
	case "refused":
		return adapters.Outcome{}, adapters.RetryableError(errors.New("connection refused"))
	case "permanent":
		return adapters.Outcome{}, adapters.PermanentError(errors.New("422 rejected"))
	}
	s.effects[req.IdempotencyKey]++
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: json.RawMessage(`{"ok":true}`)}, nil
}

func (s *scripted) Lookup(_ context.Context, req adapters.Request) (adapters.Outcome, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.effects[req.IdempotencyKey] == 0 {
		return adapters.Outcome{}, false, nil
	}
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: json.RawMessage(`{"found_by":"lookup"}`)}, true, nil
}

func (s *scripted) count(key string) (effects, attempts int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[key], len(s.attempts)
}

// runScript runs one intent (key "k") against s with the unknown policy,
// and checks how it ended: status and effect.
func runScript(t *testing.T, s *scripted, unknown executor.UnknownPolicy, status outbox.Status, effect outbox.Effect) (*adaptertest.Env, *outbox.Record) {
	t.Helper()
	s.effects = map[string]int{}
	e := adaptertest.NewEnv(t, adaptertest.Options{
		Executors: []adapters.Executor{s},
		Kinds:     testKinds,
		Runtime:   executor.Config{MaxAttempts: 3, Unknown: unknown},
	})
	id := e.Enqueue(t, e.Intent("test", "op", "k", json.RawMessage(`{}`)))
	rec := e.WaitTerminal(t, id)
	if rec.Status != status || rec.Effect != effect {
		t.Fatalf("intent %s, effect %s (last error %s, not_before %v); want %s, %s", rec.Status, rec.Effect, adaptertest.LastError(rec), rec.NotBefore, status, effect)
	}
	return e, rec
}

// An attempt whose outcome is unknown, at a destination that dedups (the
// resend policy), followed by refusals that sent nothing until attempts run
// out: the intent ends unknown — the first attempt may have acted — never
// failed, its key held (never released: a later intent with the same key
// does not run), its effect possible.
func TestUnknownThenRefusedEndsUnknown(t *testing.T) {
	t.Parallel()
	s := &scripted{script: []string{"unknown", "refused", "refused"}, dedups: true}
	e, rec := runScript(t, s, executor.UnknownResend, outbox.StatusUnknown, outbox.EffectPossible)
	if effects, attempts := s.count("k"); effects != 1 || attempts != 3 || rec.Attempts != 3 {
		t.Fatalf("effects %d, executions %d, attempts recorded %d; want 1, 3, 3", effects, attempts, rec.Attempts)
	}
	k, err := e.Store.Get(context.Background(), "test", "k")
	if err != nil || k.State != idempotency.StateHeld {
		t.Fatalf("key %+v, %v; want held", k, err)
	}
	id2 := e.Enqueue(t, e.Intent("test", "op2", "k", json.RawMessage(`{}`)))
	if rec2 := e.WaitTerminal(t, id2); rec2.Status != outbox.StatusUnknown {
		t.Fatalf("a second intent with the key ended %s, want unknown (held)", rec2.Status)
	}
	if effects, _ := s.count("k"); effects != 1 {
		t.Fatalf("effects %d after a second intent with the key, want 1", effects)
	}
}

// An unknown outcome, then a permanent refusal of the resend: the refusal
// says nothing of the first attempt, so the intent ends unknown, not
// failed.
func TestUnknownThenPermanentEndsUnknown(t *testing.T) {
	t.Parallel()
	s := &scripted{script: []string{"unknown", "permanent"}, dedups: true}
	_, rec := runScript(t, s, executor.UnknownResend, outbox.StatusUnknown, outbox.EffectPossible)
	if rec.LastError == nil || *rec.LastError == "" {
		t.Fatal("no last_error: an operator must see why it is unknown")
	}
}

// Unknown, then refused, then done: the key was kept across the refusal
// (the resend went out with it), and the intent succeeds with its effect
// done.
func TestUnknownThenRefusedThenSucceeds(t *testing.T) {
	t.Parallel()
	s := &scripted{script: []string{"unknown", "refused", "ok"}, dedups: true}
	_, rec := runScript(t, s, executor.UnknownResend, outbox.StatusSucceeded, outbox.EffectDone)
	if rec.NotBefore != nil {
		t.Fatalf("not_before %v on a succeeded intent; want none", rec.NotBefore)
	}
}

// Refusals alone (nothing ever sent): failed, effect none — failed keeps
// its meaning.
func TestRefusedOnlyFails(t *testing.T) {
	t.Parallel()
	s := &scripted{script: []string{"refused", "refused", "refused"}, dedups: true}
	e, _ := runScript(t, s, executor.UnknownResend, outbox.StatusFailed, outbox.EffectNone)
	if _, err := e.Store.Get(context.Background(), "test", "k"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("key after refusals only: %v, want released", err)
	}
}

// With a lookup: an unknown outcome whose lookup, after the settle window,
// proves nothing happened becomes effect none again, and a permanent
// refusal of the next attempt then ends the intent failed.
func TestProvenByLookupThenPermanentFails(t *testing.T) {
	t.Parallel()
	s := &scripted{script: []string{"lost", "permanent"}, lookup: true}
	runScript(t, s, executor.UnknownHold, outbox.StatusFailed, outbox.EffectNone)
	if effects, attempts := s.count("k"); effects != 0 || attempts != 2 {
		t.Fatalf("effects %d, executions %d; want 0, 2", effects, attempts)
	}
}

// A retryable error's backoff is written on the intent (not_before) in the
// same write as its error, and nothing executes the intent before it: here
// the dispatcher's relay timeout (200 ms) is far below the destination's
// Retry-After (1.5 s).
func TestRetryAfterNotBeforeHolds(t *testing.T) {
	t.Parallel()
	d := &afterDest{wait: 1500 * time.Millisecond}
	e := adaptertest.NewEnv(t, adaptertest.Options{
		Executors:    []adapters.Executor{d},
		Kinds:        testKinds,
		RelayTimeout: 200 * time.Millisecond,
	})
	id := e.Enqueue(t, e.Intent("test", "op", "k", json.RawMessage(`{}`)))
	rec := e.WaitTerminal(t, id)
	if rec.Status != outbox.StatusSucceeded {
		t.Fatalf("intent %s (%s)", rec.Status, adaptertest.LastError(rec))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.calls) != 2 {
		t.Fatalf("%d executions, want 2", len(d.calls))
	}
	gap := d.calls[1].Sub(d.calls[0])
	t.Logf("second execution %s after the first (Retry-After %s, relay timeout 200ms)", gap.Round(time.Millisecond), d.wait)
	if gap < d.wait {
		t.Fatalf("second execution %s after the first, before the Retry-After of %s", gap, d.wait)
	}
}

// afterDest answers its first call with a retryable error carrying a
// Retry-After, and succeeds afterwards.
type afterDest struct {
	mu    sync.Mutex
	wait  time.Duration
	calls []time.Time
}

func (d *afterDest) Kind() string                        { return "test" }
func (d *afterDest) Capabilities() adapters.Capabilities { return adapters.Capabilities{} }
func (d *afterDest) Execute(context.Context, adapters.Request) (adapters.Outcome, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, time.Now())
	if len(d.calls) == 1 {
		return adapters.Outcome{}, adapters.RetryableAfter(fmt.Errorf("503 busy"), d.wait)
	}
	return adapters.Outcome{Status: outbox.StatusSucceeded}, nil
}
