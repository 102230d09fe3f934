// Package startstop is the one lifecycle of fencegate's long-running
// components (River's startstop is the model): Start returns once the
// component runs and fails the second time; Stop cancels the component's
// context with the cause ErrStopped and waits until its work has ended;
// Stopped is closed then. A Lifecycle's zero value is ready to use.
//
// A component embeds or holds one:
//
//	func (c *C) Start(ctx context.Context) error {
//		ctx, err := c.life.Start(ctx, "component")
//		if err != nil {
//			return err
//		}
//		go func() { defer c.life.Done(); c.loop(ctx) }()
//		return nil
//	}
//	func (c *C) Stop()                     { c.life.Stop() }
//	func (c *C) Stopped() <-chan struct{} { return c.life.Stopped() }
package startstop

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrStopped is the cause of a component's context once Stop was called
// (context.Cause). It matches context.Canceled too (errors.Is), so code
// that takes a cancellation for a clean end — and a public component whose
// callers expect context.Canceled from Stop, like lease.Keeper — reads a
// Stop the same way.
var ErrStopped = fmt.Errorf("startstop: stopped: %w", context.Canceled)

// ErrStarted is matched by the error of a second Start, and of a Start
// after a Stop that came after a Start.
var ErrStarted = errors.New("startstop: already started")

// ErrStoppedBeforeStart is matched by the error of a Start after a Stop
// that came first: the component was stopped before it ever ran, and a
// stopped component does not start.
var ErrStoppedBeforeStart = errors.New("startstop: stopped before it was started")

// Lifecycle tracks one component's start and stop. Safe for concurrent use.
type Lifecycle struct {
	mu      sync.Mutex
	started bool // Start succeeded: cancel is set
	// stoppedFirst: Stop was called before any Start succeeded; a later
	// Start fails (ErrStoppedBeforeStart).
	stoppedFirst bool
	cancel       context.CancelCauseFunc
	once         sync.Once
	stopped      chan struct{}
}

func (l *Lifecycle) stoppedLocked() chan struct{} {
	if l.stopped == nil {
		l.stopped = make(chan struct{})
	}
	return l.stopped
}

// Start marks the component started and returns the context its work runs
// under: derived from parent and cancelled, with the cause ErrStopped, by
// Stop. A second Start — or a Start after Start and Stop — fails
// (ErrStarted); a Start after a Stop that came first fails
// (ErrStoppedBeforeStart), and so does a Start with a parent already done.
// A component whose Start fails after this call must call Done.
func (l *Lifecycle) Start(parent context.Context, name string) (context.Context, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stoppedFirst {
		return nil, fmt.Errorf("%s: %w", name, ErrStoppedBeforeStart)
	}
	if l.started {
		return nil, fmt.Errorf("%s: %w", name, ErrStarted)
	}
	if err := parent.Err(); err != nil {
		return nil, err
	}
	l.started = true
	l.stoppedLocked()
	ctx, cancel := context.WithCancelCause(parent)
	l.cancel = cancel
	return ctx, nil
}

// Done marks the component's work ended: Stopped is closed and Stop
// returns. Idempotent.
func (l *Lifecycle) Done() {
	l.mu.Lock()
	ch := l.stoppedLocked()
	l.mu.Unlock()
	l.once.Do(func() { close(ch) })
}

// Stop cancels the component's context (cause ErrStopped) and waits until
// its work has ended (Done). Before Start it marks the component stopped:
// a later Start fails. Idempotent — before Start as after it — and safe to
// call concurrently.
func (l *Lifecycle) Stop() {
	l.mu.Lock()
	ch := l.stoppedLocked()
	if !l.started {
		// Never started, so there is no context to cancel (cancel is nil):
		// mark it stopped, once or again.
		l.stoppedFirst = true
		l.mu.Unlock()
		l.Done()
		return
	}
	cancel := l.cancel
	l.mu.Unlock()
	cancel(ErrStopped)
	<-ch
}

// Stopped is closed once the component has stopped (or was stopped before
// it started).
func (l *Lifecycle) Stopped() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stoppedLocked()
}
