package dispatcher

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/wire"
)

// The relay timeout without a cliff: an intent still relayed without an
// outcome after RelayTimeout is published again (PostgreSQL is the truth,
// NATS transport), except while its kind's consumers on the stream still
// hold messages not yet delivered or not yet acknowledged. Its message may
// be one of them, waiting its turn behind a backlog that takes longer than
// the timeout to work off (a slow destination, a large drain, a deferred
// retry): relaying it again would queue a second message for the same
// consumer, work an adapter then does for nothing. A message lost inside
// NATS leaves its consumer's backlog, and is relayed again once the
// backlog of its kind is empty: later than RelayTimeout when the loss
// happened behind a backlog, but not lost.
//
// The stream is asked at most once per heldEvery, and at least four times
// per RelayTimeout: an answer used for a re-relay must be younger than the
// candidate's relay (which is older than RelayTimeout), so that "no
// backlog" means its message had been delivered and acked — or lost —
// when the stream was asked. When the stream cannot be asked (NATS
// unreachable, the stream being created), nothing is held: re-relays go
// ahead as before.
const heldEvery = time.Second

// heldKinds caches the kinds whose re-relays wait.
type heldKinds struct {
	mu   sync.Mutex
	at   time.Time
	held intents.HeldKinds
}

// heldKinds returns the kinds whose consumers hold unacknowledged or
// undelivered messages, asking the stream at most once per heldEvery.
func (d *Dispatcher) heldKinds(ctx context.Context) intents.HeldKinds {
	h := &d.held
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.at.IsZero() && time.Since(h.at) < min(heldEvery, d.cfg.RelayTimeout/4) {
		return h.held
	}
	h.at = time.Now()
	h.held = d.askStream(ctx)
	return h.held
}

func (d *Dispatcher) askStream(ctx context.Context) intents.HeldKinds {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.PublishTimeout)
	defer cancel()
	ns := wire.Namespace(d.cfg.Namespace)
	stream, err := d.js.Stream(ctx, ns.Stream())
	if err != nil {
		return intents.HeldKinds{}
	}
	var held intents.HeldKinds
	seen := map[string]bool{}
	list := stream.ListConsumers(ctx)
	// Read to the end: the lister's goroutine sends every page's entries
	// and would block on an early return.
	for info := range list.Info() {
		if info.NumPending+uint64(info.NumAckPending) == 0 {
			continue
		}
		// Only what an adapter's consumer looks like (executor.Runtime):
		// durable, explicit acks, one kind's subject. A consumer someone
		// made to look at the stream (ephemeral, no acks, a wildcard) and
		// never drains must not hold the re-relays of every kind forever.
		if info.Config.Durable == "" || info.Config.AckPolicy != jetstream.AckExplicitPolicy {
			continue
		}
		filters := info.Config.FilterSubjects
		if info.Config.FilterSubject != "" {
			filters = append(filters, info.Config.FilterSubject)
		}
		if len(filters) != 1 {
			continue
		}
		kind, ok := strings.CutPrefix(filters[0], ns.SubjectPrefix())
		if !ok || kind == "" || strings.ContainsAny(kind, "*>") {
			continue
		}
		if !seen[kind] {
			seen[kind] = true
			held.Kinds = append(held.Kinds, kind)
		}
	}
	if err := list.Err(); err != nil {
		d.log.Debug("dispatcher: could not list the stream's consumers; re-relays are not held", "error", err)
		d.m.held.Set(0)
		return intents.HeldKinds{}
	}
	d.m.held.Set(float64(len(held.Kinds)))
	return held
}
