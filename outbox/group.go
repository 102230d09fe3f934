package outbox

import (
	"context"
	"sync"
)

// grouper is group commit (Config.GroupCommit): concurrent Enqueue calls of
// one Client share transactions, each a call of fencegate_enqueue_batch.
//
// Nothing a caller sees changes:
//   - Each intent is fenced and deduplicated on its own, inside the shared
//     transaction, with the locks and fresh snapshot of a single enqueue
//     (the batch function gives every item the outcome it would get alone).
//     One caller's stale epoch or conflict is that caller's answer only.
//   - A caller is told "committed" only from a batch whose statement —
//     commit included — returned without error.
//   - When PostgreSQL rejects the shared statement as a whole (an error
//     from the server: nothing of it committed), every caller of that batch
//     is retried alone with Enqueue's single-intent path, so an item that
//     trips an unexpected database error fails only its own caller.
//   - When the outcome of the shared statement is unknown (the connection
//     broke, the timeout passed), every caller of it gets that error, as a
//     single Enqueue would: retrying with the same operation id is safe and
//     returns the intent as a duplicate if it did commit.
//   - A caller whose context ends while its intent is still queued gets the
//     context's error and its intent is never sent; once sent, the shared
//     transaction runs to its end (bounded by GroupTimeout) and the caller's
//     error means "unknown", as for a cancelled Enqueue.
//
// Batching is natural, without a timer: an idle Client sends a call at
// once, alone; while a shared transaction runs, calls queue up and leave
// together in the next one. A further transaction starts only when the
// queue holds groupBacklog calls, up to GroupFlushers at once.
type grouper struct {
	c *Client

	mu      sync.Mutex
	queue   []*groupCall
	running int
}

// groupCall is one Enqueue waiting for its shared transaction.
type groupCall struct {
	in   Intent
	done chan struct{}
	// sent and abandoned are guarded by grouper.mu.
	sent, abandoned bool
	res             Result
	err             error
}

func newGrouper(c *Client) *grouper { return &grouper{c: c} }

// groupBacklog is how many queued calls it takes to start one more shared
// transaction while one already runs (GroupMaxBatch, if smaller). Starting
// one per call, up to GroupFlushers, sent batches of 1 or 2 intents under
// load, each paying a whole transaction: measured (gateway bench, case
// enqueue-group, 16 workers, GroupFlushers 8) 0.84 of one commit per row;
// with this backlog 1.0-1.1. Below it, calls wait for the running
// transaction and leave together in the next one.
const groupBacklog = 16

// enqueue queues a validated intent and waits for its answer.
func (g *grouper) enqueue(ctx context.Context, in Intent) (Result, error) {
	call := &groupCall{in: in, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, call)
	start := g.running == 0 ||
		(g.running < g.c.cfg.GroupFlushers && len(g.queue) >= min(groupBacklog, g.c.cfg.GroupMaxBatch))
	if start {
		g.running++
	}
	g.mu.Unlock()
	if start {
		go g.flush()
	}
	select {
	case <-call.done:
		return call.res, call.err
	case <-ctx.Done():
		g.mu.Lock()
		if !call.sent {
			call.abandoned = true
			g.mu.Unlock()
			return Result{}, ctx.Err()
		}
		g.mu.Unlock()
		// Sent: the transaction is running; its answer may still be
		// "committed", which the caller can learn by retrying.
		return Result{}, ctx.Err()
	}
}

// flush sends queued calls in shared transactions until the queue is empty.
func (g *grouper) flush() {
	for {
		g.mu.Lock()
		var calls []*groupCall
		for len(g.queue) > 0 && len(calls) < g.c.cfg.GroupMaxBatch {
			call := g.queue[0]
			g.queue[0] = nil
			g.queue = g.queue[1:]
			if call.abandoned {
				continue
			}
			call.sent = true
			calls = append(calls, call)
		}
		if len(calls) == 0 {
			g.running--
			g.queue = nil // drop the backing array
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		g.run(calls)
	}
}

// run commits calls in one transaction and answers each.
func (g *grouper) run(calls []*groupCall) {
	c := g.c
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.GroupTimeout)
	defer cancel()
	if len(calls) == 1 {
		// Alone: the single-intent function is a little cheaper.
		call := calls[0]
		notify := c.notify.claim()
		call.res, call.err = c.enqueue(ctx, c.pool, call.in, notify)
		if !notify && mayHaveInserted(call.res, call.err) {
			c.notify.suppressed()
		}
		close(call.done)
		return
	}
	intents := make([]Intent, len(calls))
	for i, call := range calls {
		intents[i] = call.in
	}
	notify := c.notify.claim()
	answers, err := c.runBatch(ctx, c.pool, intents, notify)
	switch {
	case err == nil:
		inserted := false
		for i, call := range calls {
			call.res, call.err = answers[i].Result, answers[i].Err
			inserted = inserted || (call.err == nil && !call.res.Duplicate)
		}
		if inserted && !notify {
			c.notify.suppressed()
		}
	case isServerError(err):
		// Rejected as a whole: nothing committed. Each on its own, so only
		// the culprit fails.
		for _, call := range calls {
			n := c.notify.claim()
			call.res, call.err = c.enqueue(ctx, c.pool, call.in, n)
			if !n && mayHaveInserted(call.res, call.err) {
				c.notify.suppressed()
			}
		}
	default:
		// Unknown whether it committed: everyone learns it, as from a
		// single Enqueue that lost its connection.
		for _, call := range calls {
			call.err = err
		}
		if !notify {
			c.notify.suppressed()
		}
	}
	for _, call := range calls {
		close(call.done)
	}
}
