package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegate/fencegate/internal/failpoint"
	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/outagelog"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/internal/testhook"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/outbox"
)

// NotifyChannel is the PostgreSQL channel the fenced enqueue notifies at
// commit, in schema (pgschema): "<schema>_intents", fencegate_intents in
// the default schema.
func NotifyChannel(schema string) string { return pgschema.MustParse(schema).IntentsChannel() }

var (
	errNotConnected = errors.New("dispatcher: not connected to NATS")
	errPublish      = errors.New("dispatcher: publishes failed")
	// errStream marks a failure to look at or set up the stream.
	errStream = errors.New("dispatcher: stream")
)

// Dispatcher relays committed intents from PostgreSQL to JetStream. Create it
// with New, run it with Start, end it with Stop.
type Dispatcher struct {
	pool *pgxpool.Pool
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  Config
	log  *slog.Logger
	m    *metrics

	// life is the dispatcher's Start/Stop (internal/startstop).
	life startstop.Lifecycle

	// wake holds at most one pending wake-up for the claim loop.
	wake chan struct{}
	// slots is the in-flight window: one token per message awaiting its
	// PubAck.
	slots chan struct{}
	// failed is set by the ack loop when a batch had publish errors; the
	// claim loop backs off before claiming again.
	failed      atomic.Bool
	streamReady atomic.Bool
	// listenLog: the LISTEN loop's outage, said once (listenLoop, listen).
	listenLog outagelog.State
	// relayLog: the relay's outage (the claim loop's failures and the ack
	// loop's failed publishes), said once.
	relayLog outagelog.State
	// acked is set by the ack loop when a batch was published without an
	// error: a NATS outage is over only then, not when a claim succeeds
	// (a server that takes publishes and acknowledges none lets every
	// claim and publish call succeed).
	acked atomic.Bool
	// configured: ensureStream succeeded once, so the stream has this
	// dispatcher's configuration (replicas, duplicate window).
	configured atomic.Bool

	// held: the kinds whose re-relays wait for their consumers' backlog
	// (held.go).
	held heldKinds

	// claims bounds the claim transactions open at once (one token each,
	// MaxOpenClaims): each holds a pooled connection from its claim to its
	// mark.
	claims chan struct{}
	// claimTxSQL begins a claim's transaction (see claim).
	claimTxSQL string

	// hooks are the tests' hooks (internal/testhook), read from Start's
	// context before the loops start; zero in production.
	hooks testhook.Dispatcher

	// claimer claims batches of BatchSize (internal/intents); intents
	// writes the schema's intents table.
	claimer intents.Claimer
	intents intents.Table
	schema  pgschema.Schema
}

// New returns a Dispatcher relaying the intents of the database behind pool
// (the primary) over nc. It creates its own JetStream context on nc; the
// caller keeps ownership of pool and nc and closes them after Stop. A nil
// pool or nc, or a bad cfg field, is a *fenceerr.InvalidError naming it.
func New(pool *pgxpool.Pool, nc *nats.Conn, cfg Config) (*Dispatcher, error) {
	switch {
	case pool == nil:
		return nil, invalidConfig("pool", "must not be nil")
	case nc == nil:
		return nil, invalidConfig("nc", "a NATS connection is required")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: register metrics: %w", err)
	}
	// The async publish timeout resolves every PubAck future within
	// PublishTimeout, so a lost PubAck becomes an error instead of a slot
	// held forever.
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout),
	)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: jetstream: %w", err)
	}
	schema := pgschema.MustParse(cfg.Schema)
	return &Dispatcher{
		pool:       pool,
		nc:         nc,
		js:         js,
		cfg:        cfg,
		log:        cfg.Logger.With("component", "dispatcher", "dispatcher_id", cfg.ID),
		m:          m,
		wake:       make(chan struct{}, 1),
		slots:      make(chan struct{}, cfg.MaxInFlight),
		claims:     make(chan struct{}, MaxOpenClaims),
		claimTxSQL: intents.ClaimTxBegin(cfg.ClaimTTL),
		claimer:    intents.In(schema).NewClaimer(cfg.BatchSize),
		intents:    intents.In(schema),
		schema:     schema,
	}, nil
}

// MaxOpenClaims is how many claims (batches between their claim and their
// mark) a dispatcher holds at once, each in a transaction of its own: the
// pooled connections it needs beside the LISTEN connection and one for its
// samples.
const MaxOpenClaims = 4

// ID returns the dispatcher's id, which names it in logs and metrics.
func (d *Dispatcher) ID() string { return d.cfg.ID }

// StreamConfig returns the configuration of the stream
// GATEWAY_INTENTS_<namespace> the dispatcher creates or updates at start.
func (c Config) StreamConfig() jetstream.StreamConfig {
	c = c.WithDefaults()
	ns := wire.Namespace(c.Namespace)
	return jetstream.StreamConfig{
		Name:       ns.Stream(),
		Subjects:   []string{ns.SubjectAll()},
		Storage:    jetstream.FileStorage,
		Replicas:   c.StreamReplicas,
		Duplicates: c.DuplicateWindow,
		MaxAge:     c.StreamMaxAge,
	}
}

// Start creates or updates the stream and starts relaying; it returns once
// the dispatcher runs. If the stream cannot be set up yet (NATS down), Start
// logs it and the relay loop keeps trying. The dispatcher stops when ctx is
// cancelled or Stop is called.
func (d *Dispatcher) Start(ctx context.Context) error {
	ctx, err := d.life.Start(ctx, "dispatcher")
	if err != nil {
		return err
	}
	d.hooks = testhook.DispatcherFrom(ctx)
	if err := d.ensureStream(ctx); err != nil {
		d.log.Warn("dispatcher: stream not ready; will retry", "stream", wire.Namespace(d.cfg.Namespace).Stream(), "error", err)
	}

	// The batch queue holds what fits in the in-flight window; with the slots
	// and the claim tokens it bounds the memory and the claims held at once.
	batches := make(chan *batch, min(d.cfg.MaxInFlight/d.cfg.BatchSize+1, MaxOpenClaims))
	var wg sync.WaitGroup
	wg.Go(func() { d.claimLoop(ctx, batches) })
	wg.Go(func() { d.ackLoop(ctx, batches) })
	if !d.cfg.DisableListen {
		wg.Go(func() { d.listenLoop(ctx) })
	}
	go func() {
		wg.Wait()
		// Last, after both loops ended: every claim transaction has ended
		// (marked and committed, or rolled back), so no row is locked by
		// us; a written claim under our id (parked) is returned too.
		d.releaseAll()
		d.log.Info("dispatcher: stopped")
		d.life.Done()
	}()
	d.log.Info("dispatcher: started", "batch_size", d.cfg.BatchSize, "max_in_flight", d.cfg.MaxInFlight,
		"claim_ttl", d.cfg.ClaimTTL, "relay_timeout", d.cfg.RelayTimeout, "poll_interval", d.cfg.PollInterval)
	return nil
}

// Stop stops claiming, waits for the PubAcks of what was published (up to
// PublishTimeout), marks those intents relayed, returns every other claim,
// and returns when the dispatcher has stopped.
func (d *Dispatcher) Stop() { d.life.Stop() }

// Stopped is closed when the dispatcher has stopped.
func (d *Dispatcher) Stopped() <-chan struct{} { return d.life.Stopped() }

// poke wakes the claim loop, once however often it is called meanwhile.
func (d *Dispatcher) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// dbCtx returns a context for one statement. It is detached from ctx's
// cancellation on purpose: a statement cancelled mid-flight breaks its
// transaction. Letting each statement finish (bounded by DBTimeout) means
// that when a loop ends, everything it claimed is known, and marked or
// returned.
func (d *Dispatcher) dbCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d.cfg.DBTimeout)
}

func (d *Dispatcher) ensureStream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.DBTimeout)
	defer cancel()
	if _, err := d.js.CreateOrUpdateStream(ctx, d.cfg.StreamConfig()); err != nil {
		return fmt.Errorf("%w %s: create or update: %w", errStream, wire.Namespace(d.cfg.Namespace).Stream(), err)
	}
	d.configured.Store(true)
	d.streamReady.Store(true)
	return nil
}

// streamCheckTimeout bounds recheckStream's look at the stream. JetStream
// answers it in milliseconds when the stream has a leader, and never
// answers a request sent while it has none (an election after its leader
// died or hung): a short bound, retried after the backoff, resumes the
// relay within about this long of the new leader's election.
const streamCheckTimeout = 2 * time.Second

// recheckStream runs after a failed publish, before the next claim: it
// looks at the stream (a read, answered by its leader) and sets it up
// again only when it is gone (deleted by an operator, a server that lost
// its store), or while Start could not configure it yet. Not Start's
// create-or-update, bounded by DBTimeout: sent during a leader election
// that request goes unanswered, so every leader change would stall the
// relay for 10 s after its first failed publish, however soon the election
// ended (test/cluster measures the stall); and each failed publish would
// propose a stream update to the meta leader.
func (d *Dispatcher) recheckStream(ctx context.Context) error {
	if !d.configured.Load() {
		return d.ensureStream(ctx)
	}
	name := wire.Namespace(d.cfg.Namespace).Stream()
	cctx, cancel := context.WithTimeout(ctx, min(streamCheckTimeout, d.cfg.DBTimeout))
	_, err := d.js.Stream(cctx, name)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return d.ensureStream(ctx)
	case err != nil:
		return fmt.Errorf("%w %s: %w", errStream, name, err)
	}
	d.streamReady.Store(true)
	return nil
}

// intent is a claimed intent, as much as the message needs.
type intent struct {
	id         int64
	resource   string
	epoch      int64
	kind       string
	key        string
	fence      string
	payload    []byte
	relayCount int
	rerelay    bool
	createdAt  time.Time
	traceCtx   *string // W3C trace context stored with the intent, if any
}

// batch is one claim on its way through publish and PubAck.
type batch struct {
	intents []intent
	// futures are the PubAck futures of intents[:len(futures)]; the rest
	// were not published.
	futures []jetstream.PubAckFuture
	// spans are the relay spans of intents[:len(futures)] (nil for an
	// intent without a trace context), ended when the PubAck or the error
	// comes (settle).
	spans []trace.Span
	// claimedAt is when the claim was taken, by the local monotonic clock.
	claimedAt time.Time
	// tx holds the claim (the rows' locks) until the mark commits; nil for
	// an empty batch.
	tx pgx.Tx
}

// claimLoop claims and publishes batches until ctx ends, then closes
// batches so the ack loop can finish.
func (d *Dispatcher) claimLoop(ctx context.Context, batches chan<- *batch) {
	defer close(batches)
	bo := d.cfg.NewBackoff()
	poll := time.NewTimer(0) // the first round runs at once
	defer poll.Stop()
	var lastBacklog time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-poll.C:
		}
		// Claim again at once while claims come back full; back off after
		// any error so a broken NATS or PostgreSQL is not a busy loop.
		//
		// The cursor (after) lets the claims of one burst skip the pending
		// intents this loop has just claimed and not yet marked relayed:
		// without it every claim walks past the whole in-flight window
		// (up to MaxInFlight claimed rows, each read from the heap and
		// rejected by the claim check) before it finds a free row. The
		// cursor only narrows where a claim looks; it never lets a claim
		// take a row the claim check would refuse. Rows below the cursor
		// (a transaction that committed a lower id late, a claim returned
		// or expired) are looked at by a claim from 0, which runs first in
		// every wake-up, before sleeping after a burst, and at least every
		// PollInterval during one: they wait at most as long as they would
		// for the poll fallback.
		var after int64
		var fromZero time.Time
		for ctx.Err() == nil {
			if time.Since(lastBacklog) >= d.cfg.BacklogInterval {
				d.sampleBacklog(ctx)
				lastBacklog = time.Now()
			}
			if time.Since(fromZero) >= d.cfg.PollInterval {
				after = 0
			}
			if after == 0 {
				fromZero = time.Now()
			}
			n, last, err := d.round(ctx, batches, after)
			if err == nil && d.failed.Swap(false) {
				err = errPublish
			}
			if err != nil {
				after = 0
				wait := bo.NextBackOff()
				if ctx.Err() == nil {
					level, _ := d.relayLog.Failed(failureKind(err))
					d.log.Log(ctx, level, "dispatcher: relay failed; backing off", "error", err, "backoff", wait)
				}
				d.acked.Store(false)
				if !sleep(ctx, wait) {
					return
				}
				continue
			}
			// A NATS outage is over when a publish was acknowledged since,
			// or when a claim found nothing to relay with no publish
			// awaiting its answer (the stream's check before it passed):
			// not at any successful claim, since a server that takes
			// publishes and answers none lets claims and publish calls
			// succeed, and the next failed publish would say the outage
			// again.
			natsOK := d.acked.Load() || n == 0 && len(d.slots) == 0
			if (d.relayLog.Kind() != kindNATS || natsOK) && d.relayLog.Recovered() {
				d.log.Info("dispatcher: relaying works again")
			}
			bo.Reset()
			if n < d.cfg.BatchSize {
				if after > 0 {
					after = 0 // look below the cursor once before sleeping
					continue
				}
				break
			}
			after = max(after, last)
		}
		poll.Reset(d.cfg.PollInterval)
	}
}

// round claims one batch of re-relays and pending intents with ids above
// after, publishes it and hands it to the ack loop. It returns how many
// intents it claimed and the highest pending intent id among them.
func (d *Dispatcher) round(ctx context.Context, batches chan<- *batch, after int64) (int, int64, error) {
	// Claim nothing we cannot publish: a claim held while NATS is away only
	// delays the intents for another dispatcher that may be connected.
	if !d.nc.IsConnected() {
		return 0, 0, errNotConnected
	}
	if !d.streamReady.Load() {
		if err := d.recheckStream(ctx); err != nil {
			return 0, 0, err
		}
	}
	tx, intents, err := d.claim(ctx, after)
	if err != nil {
		return 0, 0, err
	}
	if len(intents) == 0 {
		return 0, 0, nil
	}
	var last int64
	for _, in := range intents {
		if !in.rerelay {
			last = max(last, in.id)
		}
	}
	b := &batch{intents: intents, claimedAt: time.Now(), tx: tx}
	if h := d.hooks.Claimed; h != nil {
		claims := make([]testhook.Claim, len(intents))
		for i, in := range intents {
			claims[i] = testhook.Claim{IntentID: in.id, Relay: in.relayCount + 1, Rerelay: in.rerelay}
		}
		h(d.cfg.ID, claims)
	}
	err = d.publish(ctx, b)
	// Always hand the batch on, even after an error: the ack loop marks what
	// was acknowledged and returns the rest of the claim.
	batches <- b
	return len(intents), last, err
}

// claim begins a claim's transaction and claims a batch in it: the rows
// stay locked, and so claimed, until settle commits the mark (or rolls
// back). It returns the open transaction with the intents, or none when
// there was nothing to claim. It waits for a claim token first.
//
// The transaction commits with synchronous_commit off: see
// internal/intents' markRelayedSQL for why the mark need not be durable.
// Its idle timeout is ClaimTTL: the server ends the session
// of a dispatcher that hangs while holding claims (SIGSTOP, a partition),
// which releases its locks as a crash would. publish stops before that
// (PublishTimeout before it), so a live dispatcher never loses its claims
// to the timeout.
func (d *Dispatcher) claim(ctx context.Context, after int64) (pgx.Tx, []intent, error) {
	select {
	case d.claims <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, nil
	}
	// Asked of NATS before the transaction begins, so that it is not held
	// open across that request.
	held := d.heldKinds(ctx)
	dctx, cancel := d.dbCtx(ctx)
	defer cancel()
	tx, err := d.pool.BeginTx(dctx, pgx.TxOptions{BeginQuery: d.claimTxSQL})
	if err != nil {
		<-d.claims
		return nil, nil, fmt.Errorf("claim outbox batch: begin: %w", err)
	}
	// The statement, and why it is written as it is: internal/intents.
	rows, err := d.claimer.Claim(dctx, tx, d.cfg.RelayTimeout, after, held)
	var intents []intent
	if err == nil {
		intents, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (intent, error) {
			var in intent
			var payload string
			err := r.Scan(&in.id, &in.resource, &in.epoch, &in.kind, &in.key, &in.fence,
				&payload, &in.relayCount, &in.rerelay, &in.createdAt, &in.traceCtx)
			in.payload = []byte(payload)
			return in, err
		})
	}
	if err != nil || len(intents) == 0 {
		d.endClaim(tx)
		if err != nil {
			return nil, nil, fmt.Errorf("claim outbox batch: %w", err)
		}
		return nil, nil, nil
	}
	d.m.claimed.Add(float64(len(intents)))
	// Re-relays first (they are the oldest work), then pending in id order.
	slices.SortStableFunc(intents, func(a, b intent) int {
		if a.rerelay != b.rerelay {
			if a.rerelay {
				return -1
			}
			return 1
		}
		return int(a.id - b.id)
	})
	return tx, intents, nil
}

// endClaim rolls back a claim's transaction, which returns its claims (the
// locks), and gives its token back.
func (d *Dispatcher) endClaim(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.DBTimeout)
	defer cancel()
	// A failed rollback leaves a broken connection, which the pool
	// discards: the server ends the transaction with the session.
	_ = tx.Rollback(ctx)
	<-d.claims
}

// message is in's message, and its relay span (nil without a trace
// context), which the caller ends when the publish is settled.
func (d *Dispatcher) message(in intent) (*nats.Msg, trace.Span) {
	relay := in.relayCount + 1
	ns := wire.Namespace(d.cfg.Namespace)
	msg := nats.NewMsg(ns.Subject(in.kind))
	msg.Data = in.payload
	// The message id is new for each relay attempt: a re-relay after the
	// relay timeout must not be swallowed by the duplicate window, while a
	// second publish within one attempt (a claim that expired mid-publish,
	// a crash before marking relayed) must be.
	msg.Header.Set(jetstream.MsgIDHeader, ns.MsgID(in.id, relay))
	if ns != "" {
		msg.Header.Set(wire.HeaderNamespace, string(ns))
	}
	msg.Header.Set(wire.HeaderIntentID, strconv.FormatInt(in.id, 10))
	msg.Header.Set(wire.HeaderResource, in.resource)
	msg.Header.Set(wire.HeaderEpoch, strconv.FormatInt(in.epoch, 10))
	msg.Header.Set(wire.HeaderKind, in.kind)
	msg.Header.Set(wire.HeaderIdempotencyKey, in.key)
	msg.Header.Set(wire.HeaderFence, in.fence)
	msg.Header.Set(wire.HeaderRelay, strconv.Itoa(relay))
	var span trace.Span
	if in.traceCtx != nil {
		// Continue the worker's trace: a relay span, child of the enqueue
		// span stored with the intent, whose context the adapter reads
		// from the headers. It covers the publish: settle ends it.
		var ctx context.Context
		ctx, span = otel.Tracer(tracerName).Start(outbox.ContextFromTrace(context.Background(), json.RawMessage(*in.traceCtx)), "fencegate.relay",
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("messaging.system", "nats"),
				attribute.String("messaging.operation.type", "send"),
				attribute.String("messaging.destination.name", msg.Subject),
				attribute.String("messaging.message.id", msg.Header.Get(jetstream.MsgIDHeader)),
				attribute.Int64("fencegate.intent_id", in.id),
				attribute.Int64("fencegate.epoch", in.epoch),
				attribute.Int("fencegate.relay", relay),
				attribute.String("fencegate.dispatcher", d.cfg.ID),
			))
		propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(msg.Header))
	}
	return msg, span
}

// endRelaySpan ends a relay span (nil: none) with the publish's outcome.
func endRelaySpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// tracerName is the instrumentation scope of the dispatcher's spans.
const tracerName = "github.com/fencegate/fencegate/dispatcher"

// publish publishes b's intents asynchronously, each taking a slot of the
// in-flight window. It stops early on shutdown, on a publish error, or when
// the claim is too close to its expiry for a PubAck to arrive in time.
func (d *Dispatcher) publish(ctx context.Context, b *batch) error {
	// Past this point a PubAck might come after the claim expired and
	// another dispatcher took the intent: stop publishing and return the
	// rest, so a claim's holder is the only publisher in the normal case.
	latest := b.claimedAt.Add(d.cfg.ClaimTTL - d.cfg.PublishTimeout)
	for _, in := range b.intents {
		select {
		case d.slots <- struct{}{}:
		case <-ctx.Done():
			return nil // shutting down: the ack loop returns the rest
		}
		if time.Now().After(latest) {
			<-d.slots
			return errors.New("dispatcher: claim too close to expiry to publish")
		}
		msg, span := d.message(in)
		f, err := d.js.PublishMsgAsync(msg)
		if err != nil {
			endRelaySpan(span, err)
			<-d.slots
			d.m.publishErrors.Inc()
			d.streamReady.Store(false)
			return fmt.Errorf("%w: intent %d: %w", errPublish, in.id, err)
		}
		b.futures = append(b.futures, f)
		b.spans = append(b.spans, span)
	}
	return nil
}

// ackLoop settles batches in the order they were published until the
// claim loop closes batches.
func (d *Dispatcher) ackLoop(ctx context.Context, batches <-chan *batch) {
	for b := range batches {
		d.settle(ctx, b)
	}
}

// settle waits for b's PubAcks, marks the acknowledged intents relayed and
// ends the claim's transaction, which returns the claims of the others.
func (d *Dispatcher) settle(ctx context.Context, b *batch) {
	var (
		okIDs    []int64
		failed   []int64
		firstErr error
	)
	// Every future resolves within PublishTimeout (the async publish
	// timeout); the extra second only guards against a future that never
	// does.
	timer := time.NewTimer(d.cfg.PublishTimeout + time.Second)
	defer timer.Stop()
	timedOut := false
	for i, f := range b.futures {
		in := b.intents[i]
		if timedOut {
			failed = append(failed, in.id)
			endRelaySpan(b.spans[i], errors.New("no PubAck in time"))
			<-d.slots
			continue
		}
		select {
		case <-f.Ok():
			endRelaySpan(b.spans[i], nil)
			okIDs = append(okIDs, in.id)
			d.m.published.Inc()
			if in.rerelay {
				d.m.rerelayed.Inc()
			}
			// The first relay only: a re-relay's or a retried intent's
			// age since its commit says nothing of how fast the relay is
			// (a re-relay is RelayTimeout old by construction).
			if in.relayCount == 0 && !in.rerelay {
				d.m.latency.Observe(d.cfg.Now().Sub(in.createdAt).Seconds())
			}
		case err := <-f.Err():
			endRelaySpan(b.spans[i], err)
			failed = append(failed, in.id)
			firstErr = cmpErr(firstErr, err)
			d.m.publishErrors.Inc()
		case <-timer.C:
			timedOut = true
			endRelaySpan(b.spans[i], errors.New("no PubAck in time"))
			failed = append(failed, in.id)
			firstErr = cmpErr(firstErr, errors.New("no PubAck in time"))
			d.m.publishErrors.Inc()
		}
		<-d.slots
	}
	for _, in := range b.intents[len(b.futures):] {
		failed = append(failed, in.id)
	}
	if firstErr != nil {
		d.failed.Store(true)
		// The stream may be gone (deleted by an operator, a server that
		// lost its store): set it up again before the next publish.
		d.streamReady.Store(false)
		if ctx.Err() == nil {
			level, _ := d.relayLog.Failed(kindNATS)
			d.log.Log(ctx, level, "dispatcher: publish failed; returning claims", "failed", len(failed), "error", firstErr)
		}
	} else if len(okIDs) > 0 {
		d.acked.Store(true)
	}
	// Only now, after the PubAck: an intent marked relayed before the
	// stream stored its message would be lost if the publish failed, until
	// the relay timeout. The reverse order (acknowledged, then a crash
	// before this commit) leaves the intent pending with its relay_count,
	// so the next claim publishes the same message id again, which the
	// duplicate window absorbs. The intents whose publish failed are not
	// marked: the commit (or rollback) returns them with the locks.
	if len(okIDs) > 0 {
		if h := d.hooks.Acked; h != nil {
			h(d.cfg.ID, okIDs)
		}
		failpoint.Inject(failpoint.AfterPublishBeforeMark) // no-op unless built with -tags failpoints
		d.markRelayed(ctx, b, okIDs)
		return
	}
	d.endClaim(b.tx)
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// markRelayed marks ids relayed in b's transaction and commits it, which
// also returns the claims of b's other intents. It does not retry: a failed
// statement breaks the transaction, and its rollback returns every claim at
// once, so the intents are claimed again and published under the same
// message ids, which the duplicate window absorbs.
func (d *Dispatcher) markRelayed(ctx context.Context, b *batch, ids []int64) {
	dctx, cancel := d.dbCtx(ctx)
	defer cancel()
	n, err := d.intents.MarkRelayed(dctx, b.tx, ids)
	if err == nil {
		err = b.tx.Commit(dctx)
	}
	if err != nil {
		d.endClaim(b.tx)
		d.m.claimsLost.Add(float64(len(ids)))
		d.log.Error("dispatcher: could not mark published intents relayed; they will be published again under the same message ids",
			"intents", len(ids), "error", err)
		return
	}
	<-d.claims
	if lost := len(ids) - int(n); lost > 0 {
		// Not expected: the rows were locked by this transaction. Counted
		// with the failed marks, so that a surprise shows.
		d.m.claimsLost.Add(float64(lost))
		d.log.Warn("dispatcher: published intents not found when marking them relayed", "intents", lost)
	}
}

// releaseAll returns every claim held under our id. It runs once both loops
// have ended, so nothing can claim after it.
func (d *Dispatcher) releaseAll() {
	bo := d.cfg.NewBackoff()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), d.cfg.DBTimeout)
		n, err := d.intents.ReleaseAll(ctx, d.pool, d.cfg.ID)
		cancel()
		if err == nil {
			if n > 0 {
				d.log.Info("dispatcher: returned claims at stop", "intents", n)
			}
			return
		}
		wait := bo.NextBackOff()
		if time.Now().Add(wait).After(deadline) {
			d.log.Error("dispatcher: could not return claims at stop; they return when they expire", "error", err)
			return
		}
		time.Sleep(wait)
	}
}

func (d *Dispatcher) sampleBacklog(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, d.cfg.DBTimeout)
	defer cancel()
	var n int64
	if err := d.pool.QueryRow(dctx, d.schema.SQL(`SELECT count(*) FROM fencegate.intents WHERE status = 'pending'`)).Scan(&n); err != nil {
		if ctx.Err() == nil {
			d.log.Debug("dispatcher: sample backlog", "error", err)
		}
		return
	}
	d.m.backlog.Set(float64(n))
}

// listenLoop keeps a connection LISTENing on the schema's NotifyChannel and pokes the
// claim loop on every notification, reconnecting with backoff.
func (d *Dispatcher) listenLoop(ctx context.Context) {
	bo := d.cfg.NewBackoff()
	for {
		err := d.listen(ctx, bo)
		if ctx.Err() != nil {
			return
		}
		wait := bo.NextBackOff()
		level, _ := d.listenLog.Failed(failureKind(err))
		d.log.Log(ctx, level, "dispatcher: listen failed; polling meanwhile", "error", err, "backoff", wait)
		if !sleep(ctx, wait) {
			return
		}
	}
}

func (d *Dispatcher) listen(ctx context.Context, bo backoff.BackOff) error {
	pool := d.pool
	if d.cfg.ListenPool != nil {
		pool = d.cfg.ListenPool
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("listen: acquire connection: %w", err)
	}
	// The connection leaves the pool: it is LISTENing, and handing it to
	// someone else would deliver them our notifications.
	conn := c.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// The channel is a checked identifier (pgschema): no quoting needed.
	if _, err := conn.Exec(ctx, "LISTEN "+d.schema.IntentsChannel()); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	bo.Reset()
	if d.listenLog.Recovered() {
		d.log.Info("dispatcher: listening again")
	}
	// Notifications sent while we were not listening are lost: look once.
	d.poke()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("listen: wait for notification: %w", err)
		}
		d.poke()
	}
}

// sleep waits for d or ctx's end; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// kindNATS is the kind of every failure of the relay's NATS side.
const kindNATS = "nats"

// failureKind tells the relay's failures apart for its outage logs:
// NATS's side (kindNATS), a PostgreSQL server's refusal by its SQLSTATE,
// and anything else (PostgreSQL or the network away) as one kind.
func failureKind(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, errPublish), errors.Is(err, errNotConnected), errors.Is(err, errStream):
		// One NATS outage, whichever step meets it first: publishes
		// without an answer, then the stream's check timing out.
		return kindNATS
	case errors.As(err, &pgErr) && !strings.HasPrefix(pgErr.Code, "08") && !strings.HasPrefix(pgErr.Code, "57"):
		return "sqlstate " + pgErr.Code
	}
	return "unreachable"
}
