package startstop

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestStartStop(t *testing.T) {
	var l Lifecycle
	ctx, err := l.Start(context.Background(), "c")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Start(context.Background(), "c"); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
	ended := make(chan struct{})
	go func() {
		<-ctx.Done()
		close(ended)
		l.Done()
	}()
	select {
	case <-l.Stopped():
		t.Fatal("stopped before Stop")
	default:
	}
	l.Stop()
	select {
	case <-ended:
	default:
		t.Fatal("Stop returned before the work ended")
	}
	if c := context.Cause(ctx); !errors.Is(c, ErrStopped) || !errors.Is(c, context.Canceled) {
		t.Fatalf("cause = %v, want ErrStopped, matching context.Canceled", c)
	}
	<-l.Stopped()
	l.Stop() // idempotent
}

// Stop before Start marks the component stopped, and is idempotent: a
// second Stop (once panicked on the nil cancel func) returns at once, and
// so do concurrent ones. A Start then says the component was stopped, not
// that it already started.
func TestStopBeforeStart(t *testing.T) {
	var l Lifecycle
	l.Stop()
	<-l.Stopped()
	l.Stop()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(l.Stop)
	}
	wg.Wait()
	_, err := l.Start(context.Background(), "c")
	if !errors.Is(err, ErrStoppedBeforeStart) || errors.Is(err, ErrStarted) {
		t.Fatalf("Start after Stop = %v, want ErrStoppedBeforeStart", err)
	}
	if want := "c: startstop: stopped before it was started"; err.Error() != want {
		t.Fatalf("Start after Stop = %q, want %q", err, want)
	}
	l.Stop()
}

// A Start after Start and Stop says it already started.
func TestStartAfterStop(t *testing.T) {
	var l Lifecycle
	if _, err := l.Start(context.Background(), "c"); err != nil {
		t.Fatal(err)
	}
	go l.Done()
	l.Stop()
	l.Stop()
	if _, err := l.Start(context.Background(), "c"); !errors.Is(err, ErrStarted) {
		t.Fatalf("Start after Start and Stop = %v, want ErrStarted", err)
	}
}

func TestStartWithDoneParent(t *testing.T) {
	var l Lifecycle
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Start(ctx, "c"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start = %v, want context.Canceled", err)
	}
	// Not started: a Start with a live parent still works.
	if _, err := l.Start(context.Background(), "c"); err != nil {
		t.Fatal(err)
	}
	go l.Done()
	select {
	case <-l.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("Done did not close Stopped")
	}
}
