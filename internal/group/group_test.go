package group

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"
)

// Calls that arrive while a batch runs leave together in the next one; each
// gets its own answer.
func TestBatchesWhileRunning(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var mu sync.Mutex
	var sizes []int
	b := New(Config{MaxBatch: 64, Flushers: 1}, func(ctx context.Context, reqs []int) []Result[int] {
		mu.Lock()
		sizes = append(sizes, len(reqs))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			started <- struct{}{}
			<-release // hold the first batch until the others queued
		}
		out := make([]Result[int], len(reqs))
		for i, r := range reqs {
			out[i].Value = r * 10
		}
		return out
	})
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Go(func() {
		if v, err := b.Do(ctx, 1); v != 10 || err != nil {
			t.Errorf("Do(1) = %d, %v", v, err)
		}
	})
	<-started
	for i := 2; i <= 9; i++ {
		wg.Go(func() {
			if v, err := b.Do(ctx, i); v != i*10 || err != nil {
				t.Errorf("Do(%d) = %d, %v", i, v, err)
			}
		})
	}
	// Let the eight queue (Do blocks until its batch ran; poll the queue).
	waitQueued(b, 8)
	close(release)
	wg.Wait()
	if len(sizes) != 2 || sizes[0] != 1 || sizes[1] != 8 {
		t.Fatalf("batch sizes %v, want [1 8]", sizes)
	}
}

// A caller whose context ends while its call is queued gets the context's
// error, and the call is never sent.
func TestAbandonedNotSent(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var sent []int
	var mu sync.Mutex
	b := New(Config{Flushers: 1}, func(ctx context.Context, reqs []int) []Result[int] {
		mu.Lock()
		sent = append(sent, reqs...)
		mu.Unlock()
		select {
		case started <- struct{}{}:
			<-release
		default:
		}
		return make([]Result[int], len(reqs))
	})
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = b.Do(context.Background(), 1) })
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := b.Do(ctx, 2); done <- err }()
	waitQueued(b, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned Do = %v, want context.Canceled", err)
	}
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1 || sent[0] != 1 {
		t.Fatalf("sent %v, want [1] (the abandoned call never sent)", sent)
	}
}

// waitQueued yields until n calls wait in b's queue.
func waitQueued[Req, Res any](b *Batcher[Req, Res], n int) {
	for {
		b.mu.Lock()
		queued := len(b.queue)
		b.mu.Unlock()
		if queued == n {
			return
		}
		runtime.Gosched()
	}
}

// While a batch runs, a further one starts only once Backlog calls are
// queued, and then at once; below it, the queued calls wait for the
// running batch and leave together after it.
func TestBacklogStartsAnotherBatch(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	started := make(chan int, 16)
	b := New(Config{MaxBatch: 8, Flushers: 4, Backlog: 8}, func(ctx context.Context, reqs []int) []Result[int] {
		mu.Lock()
		sizes = append(sizes, len(reqs))
		n := len(sizes)
		mu.Unlock()
		started <- n
		if n == 1 {
			<-release // the first batch runs until the test lets it end
		}
		return make([]Result[int], len(reqs))
	})
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = b.Do(ctx, 0) })
	<-started
	for i := 1; i <= 7; i++ {
		wg.Go(func() { _, _ = b.Do(ctx, i) })
	}
	// Until the seven are queued, or a batch started early (the bug).
	var running int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); runtime.Gosched() {
		b.mu.Lock()
		queued := len(b.queue)
		running = b.running
		b.mu.Unlock()
		if queued == 7 || running > 1 {
			break
		}
	}
	if running != 1 {
		close(release)
		t.Fatalf("%d batches running with 7 calls queued below a Backlog of 8, want 1", running)
	}
	// The eighth queued call reaches the Backlog: a second batch starts
	// at once, with all eight, while the first still runs.
	wg.Go(func() { _, _ = b.Do(ctx, 8) })
	if n := <-started; n != 2 {
		t.Fatalf("batch %d started, want the second", n)
	}
	close(release)
	wg.Wait()
	if len(sizes) != 2 || sizes[0] != 1 || sizes[1] != 8 {
		t.Fatalf("batch sizes %v, want [1 8]", sizes)
	}
}

// Answer: each key its value, the missing error where there is none, and
// the batch's error for all.
func TestAnswer(t *testing.T) {
	missing, failed := errors.New("missing"), errors.New("failed")
	got := Answer([]string{"a", "b", "a"}, map[string]int{"a": 1}, nil, missing)
	if got[0].Value != 1 || got[0].Err != nil || got[1].Err != missing || got[2].Value != 1 {
		t.Fatalf("Answer = %+v", got)
	}
	for _, r := range Answer([]string{"a", "b"}, map[string]int{"a": 1}, failed, missing) {
		if r.Err != failed {
			t.Fatalf("with the batch's error: %+v", r)
		}
	}
}
