// Package group is group commit for concurrent callers: calls that arrive
// while a shared transaction runs queue up and leave together in the next
// one, without a timer. The idempotency store's Begin and Complete and the
// runtime's intent loads use it.
//
// Batching is natural: an idle Batcher sends a call at once, alone; while a
// batch runs, calls queue and leave together in the next. A further batch
// starts at once only when the queue holds Backlog calls, up to Flushers at
// a time. A caller whose context ends while its call is still queued gets
// the context's error and its call is never sent; once sent, the batch runs
// to its end (bounded by Timeout), and the caller's error says the outcome
// is unknown, as for a cancelled single call.
package group

import (
	"cmp"
	"context"
	"sync"
	"time"
)

// Result is one call's answer from a batch.
type Result[Res any] struct {
	Value Res
	Err   error
}

// Func runs one batch: reqs in arrival order; it returns one Result per
// request, in the same order.
type Func[Req, Res any] func(ctx context.Context, reqs []Req) []Result[Res]

// Config configures a Batcher.
type Config struct {
	// MaxBatch bounds the calls of one batch. Default 64.
	MaxBatch int
	// Flushers bounds the batches running at once. Default 2.
	Flushers int
	// Backlog is how many queued calls it takes to start one more batch
	// while one already runs. Default 16 (MaxBatch if smaller).
	Backlog int
	// Timeout bounds one batch. Default 30s.
	Timeout time.Duration
}

// Batcher groups concurrent calls into batches run by one Func.
type Batcher[Req, Res any] struct {
	run Func[Req, Res]
	cfg Config

	mu      sync.Mutex
	queue   []*call[Req, Res]
	running int
}

type call[Req, Res any] struct {
	req  Req
	done chan struct{}
	// sent and abandoned are guarded by Batcher.mu.
	sent, abandoned bool
	res             Result[Res]
}

// New returns a Batcher that runs batches with run.
func New[Req, Res any](cfg Config, run Func[Req, Res]) *Batcher[Req, Res] {
	cfg.MaxBatch = cmp.Or(cfg.MaxBatch, 64)
	cfg.Flushers = cmp.Or(cfg.Flushers, 2)
	cfg.Backlog = min(cmp.Or(cfg.Backlog, 16), cfg.MaxBatch)
	cfg.Timeout = cmp.Or(cfg.Timeout, 30*time.Second)
	return &Batcher[Req, Res]{run: run, cfg: cfg}
}

// Config returns the Batcher's configuration, defaults applied.
func (b *Batcher[Req, Res]) Config() Config { return b.cfg }

// Do queues req and waits for its batch's answer.
func (b *Batcher[Req, Res]) Do(ctx context.Context, req Req) (Res, error) {
	c := &call[Req, Res]{req: req, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	start := b.running == 0 || (b.running < b.cfg.Flushers && len(b.queue) >= b.cfg.Backlog)
	if start {
		b.running++
	}
	b.mu.Unlock()
	if start {
		go b.flush()
	}
	select {
	case <-c.done:
		return c.res.Value, c.res.Err
	case <-ctx.Done():
		b.mu.Lock()
		if !c.sent {
			c.abandoned = true
		}
		b.mu.Unlock()
		var zero Res
		return zero, ctx.Err()
	}
}

// flush runs queued calls in batches until the queue is empty.
func (b *Batcher[Req, Res]) flush() {
	for {
		b.mu.Lock()
		var calls []*call[Req, Res]
		for len(b.queue) > 0 && len(calls) < b.cfg.MaxBatch {
			c := b.queue[0]
			b.queue[0] = nil
			b.queue = b.queue[1:]
			if c.abandoned {
				continue
			}
			c.sent = true
			calls = append(calls, c)
		}
		if len(calls) == 0 {
			b.running--
			b.queue = nil // drop the backing array
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.runBatch(calls)
	}
}

func (b *Batcher[Req, Res]) runBatch(calls []*call[Req, Res]) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Timeout)
	defer cancel()
	reqs := make([]Req, len(calls))
	for i, c := range calls {
		reqs[i] = c.req
	}
	results := b.run(ctx, reqs)
	for i, c := range calls {
		c.res = results[i]
		close(c.done)
	}
}

// Answer gives each of keys its value in found, err for all when err is
// not nil, and missing for a key found does not hold: the answers of a
// batch read by keys (`= ANY`), in the order of keys.
func Answer[K comparable, V any](keys []K, found map[K]V, err, missing error) []Result[V] {
	out := make([]Result[V], len(keys))
	for i, k := range keys {
		switch v, ok := found[k]; {
		case err != nil:
			out[i].Err = err
		case !ok:
			out[i].Err = missing
		default:
			out[i].Value = v
		}
	}
	return out
}
