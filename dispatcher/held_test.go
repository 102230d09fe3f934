package dispatcher_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/wire"
)

// The relay timeout is not a cliff: an intent relayed longer ago than the
// timeout is not relayed again while its kind's consumer still holds
// messages it has not delivered or not acked (its message may be waiting
// behind them); once the consumer's backlog is worked off and the intent
// still has no outcome, it is relayed again.
func TestRerelayWaitsForItsConsumersBacklog(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	const timeout = 500 * time.Millisecond
	e.start(dispatcher.Config{Schema: testdb.Schema(), RelayTimeout: timeout, PollInterval: 100 * time.Millisecond, Registerer: reg})
	ns := wire.Namespace("")
	s := e.stream(t)
	// An adapter's consumer of kind file that has not got to the message yet.
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "slow-file", FilterSubject: ns.Subject("file"),
		AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	epoch := e.acquire("slow")
	r, err := e.ob.Enqueue(ctx, fileIntent("slow", epoch, "op", 100))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the first relay recorded", func() (bool, string) {
		n := e.relayCounts()[r.IntentID]
		return n == 1, strconv.Itoa(n)
	})
	waitFor(t, 10*time.Second, "kind file held", func() (bool, string) {
		v := metricValue(t, reg, "fencegate_dispatcher_rerelay_held_kinds")
		return v == 1, strconv.FormatFloat(v, 'f', -1, 64)
	})
	// Six relay timeouts with the message waiting in the stream: no
	// second relay.
	deadline := time.Now().Add(6 * timeout)
	for time.Now().Before(deadline) {
		if n := e.relayCounts()[r.IntentID]; n != 1 {
			t.Fatalf("relay_count %d while its message waits in the consumer's backlog; want 1", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := metricValue(t, reg, "fencegate_dispatcher_rerelayed_total"); got != 0 {
		t.Fatalf("rerelayed_total = %v while held", got)
	}
	// The consumer works the message off without an outcome (as when its
	// execution was lost): the intent is relayed again.
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var acked int
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		acked++
	}
	if acked != 1 {
		t.Fatalf("fetched %d messages, want 1", acked)
	}
	waitFor(t, 15*time.Second, "the re-relay once the backlog is empty", func() (bool, string) {
		n := e.relayCounts()[r.IntentID]
		return n >= 2, strconv.Itoa(n)
	})
	t.Logf("held for %s (%d relay timeouts) with 1 message in the consumer's backlog, relayed again after it was acked", 6*timeout, 6)
}

// A consumer that is not an adapter's (here: one made by hand on every
// kind's subject, never drained) holds nothing: the intent is relayed again
// after the timeout as before.
func TestRerelayNotHeldByAnotherConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const timeout = 500 * time.Millisecond
	e.start(dispatcher.Config{Schema: testdb.Schema(), RelayTimeout: timeout, PollInterval: 100 * time.Millisecond})
	ns := wire.Namespace("")
	s := e.stream(t)
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "looking", FilterSubject: ns.SubjectAll(),
		AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	epoch := e.acquire("looked-at")
	r, err := e.ob.Enqueue(ctx, fileIntent("looked-at", epoch, "op", 100))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the re-relay despite the hand-made consumer's backlog", func() (bool, string) {
		n := e.relayCounts()[r.IntentID]
		return n >= 2, strconv.Itoa(n)
	})
}

// stream waits for the dispatcher's stream and returns it.
func (e *env) stream(t *testing.T) jetstream.Stream {
	t.Helper()
	var s jetstream.Stream
	waitFor(t, 10*time.Second, "the stream", func() (bool, string) {
		var err error
		s, err = e.js.Stream(context.Background(), wire.Namespace("").Stream())
		return err == nil, "not yet"
	})
	return s
}
