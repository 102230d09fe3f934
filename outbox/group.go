package outbox

import (
	"context"

	"github.com/fencegate/fencegate/internal/group"
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
// Batching is natural, without a timer (internal/group): an idle Client
// sends a call at once, alone; while a shared transaction runs, calls queue
// up and leave together in the next one. A further transaction starts only
// when the queue holds groupBacklog calls, up to GroupFlushers at once.
type grouper struct {
	c *Client
	b *group.Batcher[Intent, Result]
}

func newGrouper(c *Client) *grouper {
	g := &grouper{c: c}
	g.b = group.New(group.Config{
		MaxBatch: c.cfg.GroupMaxBatch,
		Flushers: c.cfg.GroupFlushers,
		Backlog:  groupBacklog,
		Timeout:  c.cfg.GroupTimeout,
	}, g.run)
	return g
}

// groupBacklog is how many queued calls it takes to start one more shared
// transaction while one already runs (GroupMaxBatch, if smaller). Starting
// one per call, up to GroupFlushers, sent batches of 1 or 2 intents under
// load, each paying a whole transaction: measured (gateway bench, case
// enqueue-group, 16 workers, GroupFlushers 8) 0.84 of one commit per row;
// with this backlog 1.0-1.1. Below it, calls wait for the running
// transaction and leave together in the next one.
const groupBacklog = 16

// enqueue queues a validated intent and waits for its answer. A caller
// whose context ends while its intent is still queued gets the context's
// error and the intent is never sent; once sent, the error means "unknown",
// as for a cancelled Enqueue (internal/group).
func (g *grouper) enqueue(ctx context.Context, in Intent) (Result, error) {
	return g.b.Do(ctx, in)
}

// run commits a batch of intents in one transaction and answers each.
func (g *grouper) run(ctx context.Context, intents []Intent) []group.Result[Result] {
	c := g.c
	out := make([]group.Result[Result], len(intents))
	alone := func(i int) {
		n := c.notify.claim()
		out[i].Value, out[i].Err = c.enqueueTraced(ctx, c.pool, intents[i], n, "", true)
		if !n && mayHaveInserted(out[i].Value, out[i].Err) {
			c.notify.suppressed()
		}
	}
	if len(intents) == 1 {
		// Alone: the single-intent function is a little cheaper.
		alone(0)
		return out
	}
	notify := c.notify.claim()
	// Every intent here is made as Config.Principal (enqueueCommitted).
	answers, err := c.runBatch(ctx, c.pool, intents, c.cfg.Principal, notify, true)
	switch {
	case err == nil:
		inserted := false
		for i := range intents {
			out[i].Value, out[i].Err = answers[i].Result, answers[i].Err
			inserted = inserted || (out[i].Err == nil && !out[i].Value.Duplicate)
		}
		if inserted && !notify {
			c.notify.suppressed()
		}
	case isServerError(err):
		// Rejected as a whole: nothing committed. Each on its own, so only
		// the culprit fails.
		for i := range intents {
			alone(i)
		}
	default:
		// Unknown whether it committed: everyone learns it, as from a
		// single Enqueue that lost its connection.
		for i := range out {
			out[i].Err = err
		}
		if !notify {
			c.notify.suppressed()
		}
	}
	return out
}
