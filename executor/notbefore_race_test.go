package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/adaptertest"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/internal/testhook"
	"github.com/fencegate/fencegate/outbox"
)

// A delivery that read the intent before another delivery's retryable
// error deferred it (not_before, written with the key given back) must not
// execute it before the deferral is over, though it reaches Begin after the
// key was given back. The chaos run with --ack-wait 3s saw a webhook sent
// again 1.478 s before its Retry-After (a redelivery while the previous
// delivery was still settling). Fails on the code of 42ba593: the second
// delivery's stale read has no not_before, and Begin finds the key free.
func TestRetryAfterHoldsForADeliveryThatReadBeforeIt(t *testing.T) {
	t.Parallel()
	// Both ways Begin decides: the group commit's shared statement, and
	// one transaction per attempt.
	for _, group := range []bool{true, false} {
		t.Run(fmt.Sprintf("group commit %t", group), func(t *testing.T) {
			t.Parallel()
			retryAfterRace(t, !group)
		})
	}
}

func retryAfterRace(t *testing.T, noGroupCommit bool) {
	const wait = 4 * time.Second
	d := newRacingDest(adapters.RetryableAfter(fmt.Errorf("503 busy"), wait), false)
	raceTwoDeliveries(t, adaptertest.Options{Kinds: testKinds, NoGroupCommit: noGroupCommit}, executor.Config{}, d, d.entered, d.secondLoaded)
	d.checkSentAgainAfter(t, wait)
}

// racingDest answers its first call, once the second delivery has read
// the intent (secondLoaded), with first — an error carrying the
// destination's Retry-After — and succeeds afterwards. It records when
// each call came.
type racingDest struct {
	first        error
	dedups       bool
	mu           sync.Mutex
	calls        []time.Time
	entered      chan struct{}
	secondLoaded chan struct{}
}

func newRacingDest(first error, dedups bool) *racingDest {
	return &racingDest{first: first, dedups: dedups, entered: make(chan struct{}), secondLoaded: make(chan struct{})}
}

func (d *racingDest) Kind() string { return "test" }
func (d *racingDest) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{DedupsOnKey: d.dedups}
}
func (d *racingDest) Execute(context.Context, adapters.Request) (adapters.Outcome, error) {
	d.mu.Lock()
	d.calls = append(d.calls, time.Now())
	first := len(d.calls) == 1
	d.mu.Unlock()
	if first {
		close(d.entered)
		<-d.secondLoaded
		return adapters.Outcome{}, d.first
	}
	return adapters.Outcome{Status: outbox.StatusSucceeded}, nil
}

// checkSentAgainAfter checks that the destination was called again, and
// not before wait (the Retry-After) had passed since the first call; it
// returns how many calls came.
func (d *racingDest) checkSentAgainAfter(t *testing.T, wait time.Duration) int {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.calls) < 2 {
		t.Fatalf("%d executions, want 2", len(d.calls))
	}
	if gap := d.calls[1].Sub(d.calls[0]); gap < wait {
		t.Fatalf("sent again %s after the first execution, before its Retry-After of %s", gap.Round(time.Millisecond), wait)
	}
	return len(d.calls)
}

// raceTwoDeliveries runs one intent through a runtime (o, cfg) executing
// dest, whose first execution closes entered and then waits for loaded: a
// duplicate delivery of the intent is published once that execution has
// begun, and is held after its load until the first one has deferred the
// intent (holdSecondLoadUntilDeferred). It checks that the race was
// reached and that the intent succeeded, and returns its record.
func raceTwoDeliveries(t *testing.T, o adaptertest.Options, cfg executor.Config, dest adapters.Executor, entered, loaded chan struct{}) *outbox.Record {
	t.Helper()
	var e *adaptertest.Env
	hooks, deferredSeen := holdSecondLoadUntilDeferred(t, &e, loaded)
	e = adaptertest.NewEnv(t, o)
	e.Runtime = e.StartRuntimeContext(hooks, t, cfg, dest)
	id := e.EnqueueHeldBack(t, e.Intent("test", "op", "k", json.RawMessage(`{}`)))
	e.Release(t, id)
	waitChan(t, entered, "the first delivery to execute")
	publishDuplicate(t, e, id)
	rec := e.WaitTerminal(t, id)
	if rec.Status != outbox.StatusSucceeded {
		t.Fatalf("intent %s (%s)", rec.Status, adaptertest.LastError(rec))
	}
	if !deferredSeen.Load() {
		t.Fatal("the second delivery never waited for the first one's deferral: the race this test is about was not reached")
	}
	return rec
}

// holdSecondLoadUntilDeferred returns a context whose runtime hook holds
// the second delivery to load an intent — it has read the intent, with no
// not_before yet — closes loaded to let the first delivery go on, and
// releases the second only once the intent's retry is deferred (its
// not_before written by the first); the flag says whether that was seen
// (the race the caller is about was reached). *e is the env, set once it
// is made (the hook is needed to make it).
func holdSecondLoadUntilDeferred(t *testing.T, e **adaptertest.Env, loaded chan struct{}) (context.Context, *atomic.Bool) {
	var loads atomic.Int32
	seen := new(atomic.Bool)
	return testhook.WithRuntime(context.Background(), testhook.Runtime{AfterLoad: func(id int64) {
		if loads.Add(1) != 2 {
			return
		}
		close(loaded)
		deadline := time.Now().Add(adaptertest.WaitTimeout)
		for time.Now().Before(deadline) {
			if rec := (*e).Get(t, id); rec.NotBefore != nil {
				seen.Store(true)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}}), seen
}
