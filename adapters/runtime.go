package adapters

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/failpoint"
	"github.com/fencegate/fencegate/internal/fencemetrics"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/outbox"
)

// UnknownPolicy says what happens to an attempt whose outcome was lost and
// cannot be looked up at the destination.
type UnknownPolicy string

// Unknown-outcome policies.
const (
	// UnknownHold records the intent as unknown and holds its idempotency
	// key: nothing is re-executed automatically; an operator resolves it.
	UnknownHold UnknownPolicy = "hold"
	// UnknownResend executes again with the same idempotency key. Only
	// allowed for executors whose destination dedups on that key
	// (DedupsOnKey() true); otherwise the runtime holds.
	UnknownResend UnknownPolicy = "resend"
)

// KeyDeduper is implemented by executors that can say whether their
// destination itself deduplicates on our idempotency key.
type KeyDeduper interface {
	DedupsOnKey() bool
}

// LookupCapable is implemented by executors whose result lookup is optional
// (configured or not); an executor implementing Looker without it is taken
// to always support lookup.
type LookupCapable interface {
	CanLookup() bool
}

// Config configures a Runtime.
type Config struct {
	// Executors to run, one per kind. Required.
	Executors []Executor
	// Concurrency bounds the intents executed at once per kind. Default 8.
	Concurrency int
	// AckWait is how long JetStream waits for an ack before redelivering.
	// Default 60s; must exceed ExecuteTimeout.
	AckWait time.Duration
	// MaxDeliver caps JetStream's deliveries of one message. Default 20.
	// Past it the dispatcher's re-relay (PostgreSQL is the truth) brings
	// the intent back if it still has no outcome.
	MaxDeliver int
	// MaxAttempts is the number of execution attempts before a retryable
	// error fails the intent. Default 5.
	MaxAttempts int
	// ExecuteTimeout bounds one Execute or Lookup call. Default 30s.
	ExecuteTimeout time.Duration
	// RetryBase and RetryMax shape the exponential redelivery delay after a
	// retryable error (with jitter). Defaults 1s and 1m.
	RetryBase, RetryMax time.Duration
	// Unknown is the unknown-outcome policy. Default hold.
	Unknown UnknownPolicy
	// DurablePrefix names the durable consumers: <prefix><kind>.
	// Default "fencegate-".
	DurablePrefix string
	// Registerer receives the runtime's metrics. Nil: none registered.
	Registerer prometheus.Registerer
	// Logger. Nil: discard.
	Logger *slog.Logger
	// AfterEffect, when set, is called after an executor returned and
	// before its outcome is recorded. Test-only (crash injection).
	AfterEffect func(req Request)
	// AfterLoad, when set, is called after an intent was loaded and before
	// its fence is checked. Test-only (race injection).
	AfterLoad func(req Request)
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Concurrency = cmp.Or(c.Concurrency, 8)
	c.AckWait = cmp.Or(c.AckWait, 60*time.Second)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, 20)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 5)
	c.ExecuteTimeout = cmp.Or(c.ExecuteTimeout, 30*time.Second)
	c.RetryBase = cmp.Or(c.RetryBase, time.Second)
	c.RetryMax = cmp.Or(c.RetryMax, time.Minute)
	c.Unknown = cmp.Or(c.Unknown, UnknownHold)
	c.DurablePrefix = cmp.Or(c.DurablePrefix, "fencegate-")
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	if len(c.Executors) == 0 {
		return errors.New("adapters: at least one executor is required")
	}
	seen := map[string]bool{}
	for _, e := range c.Executors {
		if seen[e.Kind()] {
			return fmt.Errorf("adapters: two executors for kind %q", e.Kind())
		}
		seen[e.Kind()] = true
	}
	if c.Concurrency < 1 || c.MaxAttempts < 1 || c.MaxDeliver < 1 {
		return errors.New("adapters: Concurrency, MaxAttempts and MaxDeliver must be at least 1")
	}
	if c.AckWait <= c.ExecuteTimeout {
		return fmt.Errorf("adapters: AckWait (%s) must exceed ExecuteTimeout (%s)", c.AckWait, c.ExecuteTimeout)
	}
	if c.Unknown != UnknownHold && c.Unknown != UnknownResend {
		return fmt.Errorf("adapters: unknown-outcome policy must be hold or resend, got %q", c.Unknown)
	}
	return nil
}

// Runtime consumes relayed intents from JetStream and executes them through
// the executors, at most once per business idempotency key.
//
// Per message: load the intent from PostgreSQL (the message only points at
// it); skip it if it is terminal; for fence policy execute, record
// superseded if the resource's epoch moved on; then Begin on the key and
// execute, return the stored result, look up, or hold. The message is acked
// (a double ack, confirmed by the server) only after the outcome is
// committed in PostgreSQL: a crash before that commit means redelivery, and
// the key's state makes the redelivery look up instead of executing twice.
type Runtime struct {
	pool   *pgxpool.Pool
	nc     *nats.Conn
	cfg    Config
	store  *idempotency.Store
	outbox *outbox.Client
	m      *runtimeMetrics

	cancel   context.CancelFunc
	stopped  chan struct{}
	stopOnce sync.Once
}

// NewRuntime returns a runtime. store is the idempotency store; ob reads
// intents.
func NewRuntime(pool *pgxpool.Pool, nc *nats.Conn, store *idempotency.Store, ob *outbox.Client, cfg Config) (*Runtime, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newRuntimeMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Runtime{pool: pool, nc: nc, cfg: cfg, store: store, outbox: ob, m: m, stopped: make(chan struct{})}, nil
}

// Start creates (or updates) a durable pull consumer per kind and starts
// consuming. It waits for the stream to exist (the dispatcher creates it)
// until ctx ends. It returns once consuming.
func (r *Runtime) Start(ctx context.Context) error {
	js, err := jetstream.New(r.nc)
	if err != nil {
		return fmt.Errorf("adapters: jetstream: %w", err)
	}
	var stream jetstream.Stream
	for wait := 100 * time.Millisecond; ; wait = min(wait*2, 5*time.Second) {
		stream, err = js.Stream(ctx, wire.Stream)
		if err == nil {
			break
		}
		r.cfg.Logger.Info("adapters: waiting for stream", "stream", wire.Stream, "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("adapters: stream %s: %w", wire.Stream, err)
		case <-time.After(wait):
		}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	var consumers []jetstream.ConsumeContext
	var wg sync.WaitGroup
	for _, ex := range r.cfg.Executors {
		cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable:       r.cfg.DurablePrefix + ex.Kind(),
			FilterSubject: wire.Subject(ex.Kind()),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       r.cfg.AckWait,
			MaxDeliver:    r.cfg.MaxDeliver,
			MaxAckPending: r.cfg.Concurrency * 4,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			cancel()
			for _, c := range consumers {
				c.Stop()
			}
			return fmt.Errorf("adapters: consumer for %s: %w", ex.Kind(), err)
		}
		sem := make(chan struct{}, r.cfg.Concurrency)
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			// Bounded concurrency: the handler blocks while all slots are
			// busy, which stops the pull and leaves messages in the stream.
			select {
			case sem <- struct{}{}:
			case <-runCtx.Done():
				return // not acked: redelivered to another consumer later
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				r.handle(runCtx, ex, msg)
			}()
		}, jetstream.PullMaxMessages(r.cfg.Concurrency*2))
		if err != nil {
			cancel()
			for _, c := range consumers {
				c.Stop()
			}
			return fmt.Errorf("adapters: consume %s: %w", ex.Kind(), err)
		}
		consumers = append(consumers, cc)
		r.cfg.Logger.Info("adapters: consuming", "kind", ex.Kind(), "durable", r.cfg.DurablePrefix+ex.Kind(), "concurrency", r.cfg.Concurrency)
	}
	go func() {
		defer close(r.stopped)
		<-runCtx.Done()
		for _, c := range consumers {
			c.Stop()
		}
		// In-flight executions finish (each bounded by ExecuteTimeout):
		// cutting an effect short would only create unknown outcomes.
		wg.Wait()
	}()
	return nil
}

// Stop stops consuming and waits for in-flight intents to finish.
func (r *Runtime) Stop() {
	r.stopOnce.Do(func() {
		if r.cancel != nil {
			r.cancel()
		}
	})
	if r.cancel != nil {
		<-r.stopped
	}
}

// Stopped is closed when the runtime has stopped.
func (r *Runtime) Stopped() <-chan struct{} { return r.stopped }

// verdict is how a message is settled after its outcome is committed.
type verdict int

const (
	ack verdict = iota
	retry
	term
)

func (r *Runtime) handle(ctx context.Context, ex Executor, msg jetstream.Msg) {
	log := r.cfg.Logger.With("kind", ex.Kind())
	id, err := wire.ParseIntentID(msg.Headers().Get(wire.HeaderIntentID))
	if err != nil {
		log.Error("adapters: message without intent id; terminating it", "subject", msg.Subject(), "error", err)
		_ = msg.Term()
		return
	}
	log = log.With("intent_id", id)
	// The work itself is not cut short by shutdown (see Start); each step is
	// bounded by its own timeout.
	wctx := context.WithoutCancel(ctx)
	// Continue the trace the dispatcher's relay span put in the headers
	// (process falls back to the context stored with the intent).
	wctx = propagation.TraceContext{}.Extract(wctx, propagation.HeaderCarrier(msg.Headers()))
	v, delay, err := r.process(wctx, ex, id, log)
	if err != nil {
		log.Warn("adapters: intent not settled; will be redelivered", "error", err)
		r.m.errors.WithLabelValues(ex.Kind()).Inc()
		_ = msg.NakWithDelay(r.delay(msg))
		return
	}
	switch v {
	case ack:
		actx, cancel := context.WithTimeout(wctx, 10*time.Second)
		defer cancel()
		// The ack comes only now, after the outcome is committed in
		// PostgreSQL. DoubleAck waits for the server's confirmation; if it
		// is lost, the redelivery finds the intent terminal and acks again.
		if err := msg.DoubleAck(actx); err != nil {
			log.Warn("adapters: ack failed; the redelivery will find the intent terminal", "error", err)
		}
	case retry:
		_ = msg.NakWithDelay(cmp.Or(delay, r.delay(msg)))
	case term:
		_ = msg.Term()
	}
}

// delay is the redelivery delay after the n-th delivery: exponential with
// full jitter, between RetryBase/2 and RetryMax.
func (r *Runtime) delay(msg jetstream.Msg) time.Duration {
	n := uint64(1)
	if md, err := msg.Metadata(); err == nil {
		n = md.NumDelivered
	}
	d := r.cfg.RetryBase
	for i := uint64(1); i < n && d < r.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.RetryMax)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// tracerName is the instrumentation scope of the runtime's spans.
const tracerName = "github.com/fencegate/fencegate/adapters"

func (r *Runtime) process(ctx context.Context, ex Executor, id int64, log *slog.Logger) (v verdict, delay time.Duration, err error) {
	rec, err := r.outbox.Get(ctx, id)
	if errors.Is(err, outbox.ErrNotFound) {
		log.Warn("adapters: intent not in the outbox (swept or never committed); dropping message")
		return term, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	if rec.Status.Terminal() {
		r.m.outcomes.WithLabelValues(ex.Kind(), "already_terminal").Inc()
		return ack, 0, nil
	}
	if rec.Kind != ex.Kind() {
		// Not an error result: handle would nak it and have it redelivered.
		log.Error("adapters: intent of another kind on this consumer; terminating the message", "intent_kind", rec.Kind)
		return term, 0, nil
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = outbox.ContextFromTrace(ctx, rec.TraceContext)
	}
	ctx, span := otel.Tracer(tracerName).Start(ctx, "fencegate.execute",
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.Int64("fencegate.intent_id", rec.IntentID),
			attribute.Int64("fencegate.epoch", rec.Epoch),
			attribute.String("fencegate.resource", rec.Resource),
			attribute.String("fencegate.kind", rec.Kind),
			attribute.String("fencegate.idempotency_key", rec.IdempotencyKey),
		))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	req := Request{IntentID: rec.IntentID, Resource: rec.Resource, Epoch: rec.Epoch, Kind: rec.Kind,
		IdempotencyKey: rec.IdempotencyKey, Fence: rec.Fence, Payload: rec.Payload}
	log = log.With("resource", rec.Resource, "epoch", rec.Epoch, "key", rec.IdempotencyKey)
	if r.cfg.AfterLoad != nil {
		r.cfg.AfterLoad(req)
	}

	// Fence policy execute: re-check authority now. An intent whose
	// resource moved on is superseded, never executed. (A destination that
	// can check, like the file adapter, checks again at the write.)
	var fencedBy int64
	if rec.Fence == outbox.FenceExecute {
		var current int64
		if err := r.pool.QueryRow(ctx, `SELECT epoch FROM resources WHERE resource_id = $1`, rec.Resource).Scan(&current); err != nil {
			return 0, 0, fmt.Errorf("read resource epoch: %w", err)
		}
		if current > rec.Epoch && rec.Attempts == 0 {
			if _, err := r.store.CompleteIntent(ctx, id, outbox.StatusSuperseded, supersededResult(current), ""); err != nil && !errors.Is(err, idempotency.ErrIntentTerminal) {
				return 0, 0, err
			}
			r.m.stale.WithLabelValues(fencemetrics.WhereExecuteFence).Inc()
			log.Info("adapters: superseded before execution", "current_epoch", current)
			r.m.outcomes.WithLabelValues(ex.Kind(), "superseded").Inc()
			return ack, 0, nil
		}
		if current > rec.Epoch {
			// An earlier attempt of this intent may have performed the
			// effect before the resource moved on, and crashed before
			// recording it: calling it superseded would record an effect
			// that happened as one that never did, and leave its key
			// started. Go through the key: never execute, but find out.
			fencedBy = current
		}
	}

	fp := idempotency.Fingerprint(rec.Kind, rec.Payload)
	d, err := r.store.Begin(ctx, rec.Kind, rec.IdempotencyKey, fp, id)
	if errors.Is(err, idempotency.ErrIntentTerminal) {
		// Cancelled (or completed) between our read and Begin: nothing to do.
		return ack, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("begin: %w", err)
	}
	req.Attempt = d.Attempts
	switch d.Outcome {
	case idempotency.OutcomeDone:
		// The effect already happened (or failed for good) under this key,
		// possibly for another intent: record the stored result, do nothing.
		if _, err := r.store.CompleteIntent(ctx, id, d.Status, d.Result, ""); err != nil && !errors.Is(err, idempotency.ErrIntentTerminal) {
			return 0, 0, err
		}
		r.m.outcomes.WithLabelValues(ex.Kind(), "done_before").Inc()
		log.Info("adapters: key already completed; recorded the stored result", "status", d.Status, "owner_intent_id", d.OwnerIntentID)
		return ack, 0, nil
	case idempotency.OutcomeConflict:
		msg := fmt.Sprintf("idempotency key %q is used by intent %d with different content; not executed", rec.IdempotencyKey, d.OwnerIntentID)
		if _, err := r.store.CompleteIntent(ctx, id, outbox.StatusFailed, nil, msg); err != nil && !errors.Is(err, idempotency.ErrIntentTerminal) {
			return 0, 0, err
		}
		r.m.outcomes.WithLabelValues(ex.Kind(), "conflict").Inc()
		log.Warn("adapters: " + msg)
		return ack, 0, nil
	case idempotency.OutcomeBusy:
		if d.Held {
			// Held with an unknown outcome (another intent of the same key):
			// this intent's fate is the same unknown.
			msg := fmt.Sprintf("idempotency key %q is held with an unknown outcome (intent %d); resolve that intent", rec.IdempotencyKey, d.OwnerIntentID)
			if _, err := r.store.CompleteIntent(ctx, id, outbox.StatusUnknown, d.Result, msg); err != nil && !errors.Is(err, idempotency.ErrIntentTerminal) {
				return 0, 0, err
			}
			return ack, 0, nil
		}
		r.m.outcomes.WithLabelValues(ex.Kind(), "busy").Inc()
		return retry, max(d.RetryAfter, r.cfg.RetryBase), nil
	case idempotency.OutcomeRecover:
		// An earlier attempt started and was abandoned: it may have
		// performed the effect. Look it up before anything else.
		if fencedBy > 0 {
			return r.recoverFenced(ctx, ex, req, d, fencedBy, log)
		}
		return r.recoverAttempt(ctx, ex, req, d, log)
	case idempotency.OutcomeExecute:
		if fencedBy > 0 {
			// The key was free: no earlier attempt performed the effect.
			r.m.stale.WithLabelValues(fencemetrics.WhereExecuteFence).Inc()
			log.Info("adapters: superseded before execution", "current_epoch", fencedBy)
			r.m.outcomes.WithLabelValues(ex.Kind(), "superseded").Inc()
			return r.complete(ctx, req, d, Outcome{Status: outbox.StatusSuperseded, Result: supersededResult(fencedBy)}, "")
		}
		return r.execute(ctx, ex, req, d, log)
	}
	return 0, 0, fmt.Errorf("begin: unexpected outcome %q", d.Outcome)
}

func (r *Runtime) canLookup(ex Executor) (Looker, bool) {
	l, ok := ex.(Looker)
	if !ok {
		return nil, false
	}
	if c, ok := ex.(LookupCapable); ok && !c.CanLookup() {
		return nil, false
	}
	return l, true
}

func (r *Runtime) dedups(ex Executor) bool {
	d, ok := ex.(KeyDeduper)
	return ok && d.DedupsOnKey()
}

func (r *Runtime) recoverAttempt(ctx context.Context, ex Executor, req Request, d idempotency.Decision, log *slog.Logger) (verdict, time.Duration, error) {
	if l, ok := r.canLookup(ex); ok {
		lctx, cancel := context.WithTimeout(ctx, r.cfg.ExecuteTimeout)
		out, found, err := l.Lookup(lctx, req)
		cancel()
		if err != nil {
			// Can't tell yet. Keep the key owned (never Release: that would
			// say the effect did not happen); once our lock expires the
			// redelivery gets Recover again and looks up again.
			log.Warn("adapters: lookup failed; will look up again", "error", err)
			return retry, 0, nil
		}
		if found {
			log.Info("adapters: recovered: the effect had happened; recording it")
			r.m.outcomes.WithLabelValues(ex.Kind(), "recovered_by_lookup").Inc()
			return r.complete(ctx, req, d, out, "")
		}
		// The destination has no trace of it: the abandoned attempt did not
		// perform the effect. Execute now, as the owner.
		return r.execute(ctx, ex, req, d, log)
	}
	if r.cfg.Unknown == UnknownResend && r.dedups(ex) {
		return r.execute(ctx, ex, req, d, log)
	}
	return r.hold(ctx, req, d, "an earlier attempt was abandoned and the destination offers no lookup", log)
}

func supersededResult(current int64) json.RawMessage {
	res, _ := json.Marshal(map[string]any{"superseded_by_epoch": current, "fenced_at": "execute"})
	return res
}

// recoverFenced handles an abandoned attempt of an intent whose resource
// has moved on (fence policy execute): it is never executed again, but the
// abandoned attempt may have performed the effect. Found by lookup: that
// is recorded; not found: superseded; no lookup: held as unknown.
func (r *Runtime) recoverFenced(ctx context.Context, ex Executor, req Request, d idempotency.Decision, current int64, log *slog.Logger) (verdict, time.Duration, error) {
	l, ok := r.canLookup(ex)
	if !ok {
		return r.hold(ctx, req, d, fmt.Sprintf("an earlier attempt was abandoned, the resource moved on to epoch %d, and the destination offers no lookup", current), log)
	}
	lctx, cancel := context.WithTimeout(ctx, r.cfg.ExecuteTimeout)
	out, found, err := l.Lookup(lctx, req)
	cancel()
	if err != nil {
		log.Warn("adapters: lookup failed; will look up again", "error", err)
		return retry, 0, nil
	}
	if found {
		log.Info("adapters: recovered: the effect had happened before the resource moved on; recording it", "current_epoch", current)
		r.m.outcomes.WithLabelValues(ex.Kind(), "recovered_by_lookup").Inc()
		return r.complete(ctx, req, d, out, "")
	}
	r.m.stale.WithLabelValues(fencemetrics.WhereExecuteFence).Inc()
	log.Info("adapters: superseded before execution", "current_epoch", current)
	r.m.outcomes.WithLabelValues(ex.Kind(), "superseded").Inc()
	return r.complete(ctx, req, d, Outcome{Status: outbox.StatusSuperseded, Result: supersededResult(current)}, "")
}

func (r *Runtime) execute(ctx context.Context, ex Executor, req Request, d idempotency.Decision, log *slog.Logger) (verdict, time.Duration, error) {
	ectx, cancel := context.WithTimeout(ctx, r.cfg.ExecuteTimeout)
	start := time.Now()
	out, err := ex.Execute(ectx, req)
	cancel()
	r.m.duration.WithLabelValues(ex.Kind()).Observe(time.Since(start).Seconds())
	if r.cfg.AfterEffect != nil {
		r.cfg.AfterEffect(req)
	}
	failpoint.Inject(failpoint.AfterEffectBeforeRecord) // no-op unless built with -tags failpoints
	switch {
	case err == nil:
		out.Status = cmp.Or(out.Status, outbox.StatusSucceeded)
		r.m.outcomes.WithLabelValues(ex.Kind(), string(out.Status)).Inc()
		log.Info("adapters: executed", "status", out.Status, "attempt", req.Attempt)
		return r.complete(ctx, req, d, out, "")
	case IsUnknown(err):
		log.Warn("adapters: outcome unknown", "error", err)
		if l, ok := r.canLookup(ex); ok {
			lctx, cancel := context.WithTimeout(ctx, r.cfg.ExecuteTimeout)
			lout, found, lerr := l.Lookup(lctx, req)
			cancel()
			switch {
			case lerr == nil && found:
				r.m.outcomes.WithLabelValues(ex.Kind(), "recovered_by_lookup").Inc()
				return r.complete(ctx, req, d, lout, "")
			case lerr == nil:
				// Looked up and not there: it did not happen. Retry.
				return r.retryable(ctx, ex, req, d, err, log)
			default:
				// The lookup failed too: keep the key owned; once its lock
				// expires the redelivery gets Recover and looks up again.
				log.Warn("adapters: lookup after unknown outcome failed", "error", lerr)
				return retry, 0, nil
			}
		}
		if r.cfg.Unknown == UnknownResend && r.dedups(ex) {
			return r.retryable(ctx, ex, req, d, err, log)
		}
		return r.hold(ctx, req, d, err.Error(), log)
	case IsRetryable(err):
		return r.retryable(ctx, ex, req, d, err, log)
	default:
		r.m.outcomes.WithLabelValues(ex.Kind(), "failed").Inc()
		log.Warn("adapters: permanent error; intent failed", "error", err)
		return r.complete(ctx, req, d, Outcome{Status: outbox.StatusFailed}, err.Error())
	}
}

// retryable handles an attempt that definitely did not perform the effect.
func (r *Runtime) retryable(ctx context.Context, ex Executor, req Request, d idempotency.Decision, cause error, log *slog.Logger) (verdict, time.Duration, error) {
	// Give the key back first, so the next attempt gets Execute at once.
	if err := r.persist(ctx, func() error { return r.store.Release(ctx, req.Kind, req.IdempotencyKey, d.Token) }); err != nil {
		return 0, 0, fmt.Errorf("release key: %w", err)
	}
	if req.Attempt >= r.cfg.MaxAttempts {
		msg := fmt.Sprintf("gave up after %d attempts: %v", req.Attempt, cause)
		r.m.outcomes.WithLabelValues(ex.Kind(), "failed").Inc()
		log.Warn("adapters: attempts exhausted; intent failed (an operator can retry it)", "attempts", req.Attempt, "error", cause)
		if _, err := r.store.CompleteIntent(ctx, req.IntentID, outbox.StatusFailed, nil, msg); err != nil && !errors.Is(err, idempotency.ErrIntentTerminal) {
			return 0, 0, err
		}
		return ack, 0, nil
	}
	r.m.outcomes.WithLabelValues(ex.Kind(), "retry").Inc()
	log.Info("adapters: retryable error; will retry", "attempt", req.Attempt, "error", cause)
	if _, err := r.pool.Exec(ctx, `UPDATE intents SET last_error = $2, updated_at = now() WHERE intent_id = $1`, req.IntentID, cause.Error()); err != nil {
		log.Warn("adapters: record last error", "error", err)
	}
	return retry, 0, nil
}

func (r *Runtime) hold(ctx context.Context, req Request, d idempotency.Decision, why string, log *slog.Logger) (verdict, time.Duration, error) {
	r.m.outcomes.WithLabelValues(req.Kind, "unknown").Inc()
	log.Warn("adapters: outcome unknown and cannot be looked up; holding for an operator", "reason", why)
	return r.complete(ctx, req, d, Outcome{Status: outbox.StatusUnknown}, why)
}

func (r *Runtime) complete(ctx context.Context, req Request, d idempotency.Decision, out Outcome, errMsg string) (verdict, time.Duration, error) {
	err := r.persist(ctx, func() error {
		_, err := r.store.Complete(ctx, idempotency.Completion{
			Kind: req.Kind, Key: req.IdempotencyKey, Token: d.Token, IntentID: req.IntentID,
			Status: out.Status, Result: out.Result, Error: errMsg,
		})
		return err
	})
	if errors.Is(err, idempotency.ErrLostOwnership) {
		// Another attempt took the key over (our lock expired mid-effect):
		// its Begin answered Recover and it looks the outcome up. Let the
		// redelivery find out what it recorded.
		return retry, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("record outcome: %w", err)
	}
	return ack, 0, nil
}

// persist runs a write that records what this attempt knows (an outcome,
// a release), retrying it with backoff while PostgreSQL is unreachable —
// restarting, failing over — for up to half the AckWait. Giving up at once
// would leave the key owned by this attempt until its lock expires
// (LockTimeout), and the intent would wait that long for a recovery that
// looks up what this attempt already knew. Completing and releasing are
// idempotent for the same token, so a retry after a lost answer is safe.
// Ownership and validation errors are not retried.
func (r *Runtime) persist(ctx context.Context, write func() error) error {
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(2*time.Second),
		backoff.WithMaxElapsedTime(r.cfg.AckWait/2),
	)
	for {
		err := write()
		if err == nil || errors.Is(err, idempotency.ErrLostOwnership) || errors.Is(err, idempotency.ErrInvalid) ||
			errors.Is(err, idempotency.ErrIntentNotFound) {
			return err
		}
		wait := bo.NextBackOff()
		if wait == backoff.Stop {
			return err
		}
		r.cfg.Logger.Warn("adapters: recording failed; retrying", "error", err, "in", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}
