package executor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/failpoint"
	"github.com/fencegate/fencegate/internal/fencemetrics"
	"github.com/fencegate/fencegate/internal/group"
	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/outagelog"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/internal/testhook"
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

// DefaultMaxRetryAfter is Config.MaxRetryAfter's default: a destination's
// Retry-After is honoured up to an hour.
const DefaultMaxRetryAfter = time.Hour

// DefaultLookupSettle is Config.LookupSettle's default: 10 minutes, RFC
// 5321's timeout for the reply to the end-of-data marker (§4.5.3.2.6) — a
// destination may still take a message that long after the final dot.
const DefaultLookupSettle = 10 * time.Minute

// DefaultConcurrency is Config.Concurrency's default: enough intents in
// flight per kind for the idempotency store's group commit to share its
// transactions among many. Measured with the no-op adapter (gateway bench
// e2e-drain, same cluster, same minutes): 8 settled ~700 intents/s, 64
// ~1,900/s, 256 ~3,600/s. A destination that takes less declares it
// (adapters.Capabilities.Concurrency: email's MaxSessions, 16).
const DefaultConcurrency = 256

// Defaults of Config's other fields.
const (
	DefaultMaxAttempts    = 5
	DefaultExecuteTimeout = 30 * time.Second
	// DefaultAckWait is AckWait's default when twice ExecuteTimeout is
	// shorter (see Config.AckWait).
	DefaultAckWait       = 60 * time.Second
	DefaultMaxDeliver    = 20
	DefaultRetryBase     = time.Second
	DefaultRetryMax      = time.Minute
	DefaultDurablePrefix = "fencegate-"
)

// Config configures a Runtime. The zero value of every field means its
// default. Validate (and NewRuntime) refuse a bad field with a
// *fenceerr.InvalidError naming it (MaxAttempts, ExecuteTimeout, …).
type Config struct {
	// Executors to run, one per kind. Required.
	Executors []adapters.Executor
	// Schema is the PostgreSQL schema fencegate's tables live in (gateway
	// migrate --schema). Default: the outbox client's (outbox.Config.Schema);
	// another one is refused.
	Schema string
	// Concurrency bounds the intents executed at once per kind. Default
	// DefaultConcurrency.
	Concurrency int
	// AckWait is how long JetStream waits for an ack before redelivering.
	// It must exceed ExecuteTimeout: a message redelivered while its
	// attempt still executes would only find the key owned and wait.
	// Default: twice ExecuteTimeout, at least DefaultAckWait.
	AckWait time.Duration
	// MaxDeliver caps JetStream's deliveries of one message. Default
	// DefaultMaxDeliver. Past it the dispatcher's re-relay (PostgreSQL is
	// the truth) brings the intent back if it still has no outcome.
	MaxDeliver int
	// MaxAttempts is the number of execution attempts before a retryable
	// error fails the intent. Default DefaultMaxAttempts.
	MaxAttempts int
	// ExecuteTimeout bounds one Execute or Lookup call. Default
	// DefaultExecuteTimeout.
	ExecuteTimeout time.Duration
	// KeyLockTimeout is the idempotency store's lock timeout
	// (idempotency.Config.LockTimeout), given so that the runtime's rule on
	// it is checked: it must be more than twice ExecuteTimeout. An attempt
	// holds its key through one Execute and, when that outcome is lost, one
	// Lookup, each bounded by ExecuteTimeout; a lock that expired before
	// both could end would let another attempt take the key over (Recover)
	// while the effect may still be under way. gateway.Config sets it from
	// its Idempotency. Set, NewRuntime also checks that it is the store's.
	// Zero: not checked (a test that simulates a crash may want a lock
	// shorter than an execution).
	KeyLockTimeout time.Duration
	// RetryBase and RetryMax shape the exponential delay of a retry after a
	// retryable error (by attempt, with jitter). Defaults DefaultRetryBase
	// and DefaultRetryMax.
	RetryBase, RetryMax time.Duration
	// MaxRetryAfter bounds how long a destination's Retry-After
	// (adapters.Error.RetryAfter) defers a retry: a longer one waits this long.
	// Default DefaultMaxRetryAfter (1h).
	MaxRetryAfter time.Duration
	// Unknown is the unknown-outcome policy. Default hold.
	Unknown UnknownPolicy
	// LookupSettle is how long after an attempt's last I/O with the
	// destination a lookup that finds nothing is trusted as proof that the
	// effect did not happen. A lookup that finds the effect is trusted at
	// once. Until the window has passed the intent waits: its key stays
	// owned (never released), its lock renewed, and it is looked up again
	// with backoff — neither executed again nor released. The moment of the
	// last I/O is kept on the key, so the wait survives a crash. Default
	// DefaultLookupSettle; an executor may declare its own
	// (adapters.Capabilities.LookupSettle).
	LookupSettle time.Duration
	// DurablePrefix names the durable consumers: <prefix><namespace>-<kind>
	// (<prefix><kind> without a namespace). Default DefaultDurablePrefix.
	DurablePrefix string
	// Namespace is the deployment's namespace on NATS (as the
	// dispatcher's): the stream and subjects consumed, and the
	// Fencegate-Namespace header every message must carry; a message of
	// another namespace (or none) is terminated, logged and counted
	// (fencegate_adapter_foreign_messages_total), never executed. Empty: the
	// names from before namespaces, and no header check.
	Namespace string
	// Process names this process in the intents' attempt history
	// (intent_attempts.process). Default: host name and process id.
	Process string
	// Registerer receives the runtime's metrics. Nil: none registered.
	Registerer prometheus.Registerer
	// Logger. Nil: discard.
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, DefaultMaxDeliver)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.ExecuteTimeout = cmp.Or(c.ExecuteTimeout, DefaultExecuteTimeout)
	// After ExecuteTimeout's default: AckWait's follows from it.
	c.AckWait = cmp.Or(c.AckWait, max(DefaultAckWait, 2*c.ExecuteTimeout))
	c.RetryBase = cmp.Or(c.RetryBase, DefaultRetryBase)
	c.RetryMax = cmp.Or(c.RetryMax, DefaultRetryMax)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, DefaultMaxRetryAfter)
	c.Unknown = cmp.Or(c.Unknown, UnknownHold)
	c.LookupSettle = cmp.Or(c.LookupSettle, DefaultLookupSettle)
	c.DurablePrefix = cmp.Or(c.DurablePrefix, DefaultDurablePrefix)
	c.Process = cmp.Or(c.Process, defaultProcess())
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks c's settings, its defaults applied, connecting to
// nothing; its Executors are NewRuntime's to check. An error is a
// *fenceerr.InvalidError naming the field.
func (c Config) Validate() error { return c.WithDefaults().checkSettings() }

// validate checks c, defaults applied, executors included.
func (c Config) validate() error {
	if len(c.Executors) == 0 {
		return invalidConfig("Executors", "at least one executor is required")
	}
	seen := map[string]bool{}
	for _, e := range c.Executors {
		if e == nil {
			return invalidConfig("Executors", "an executor is nil")
		}
		if err := outbox.ValidateKindName("Executors", e.Kind()); err != nil {
			return fmt.Errorf("executor: %w", err)
		}
		if seen[e.Kind()] {
			return invalidConfig("Executors", "two executors for kind %q", e.Kind())
		}
		seen[e.Kind()] = true
		caps := e.Capabilities()
		if _, ok := e.(adapters.Looker); caps.Lookup && !ok {
			return invalidConfig("Executors", "the executor for kind %q declares Lookup and does not implement Looker", e.Kind())
		}
		if caps.Concurrency < 0 {
			return invalidConfig("Executors", "the executor for kind %q declares a negative Concurrency (%d)", e.Kind(), caps.Concurrency)
		}
		if caps.LookupSettle < 0 {
			return invalidConfig("Executors", "the executor for kind %q declares a negative LookupSettle (%s)", e.Kind(), caps.LookupSettle)
		}
	}
	return c.checkSettings()
}

// checkSettings checks every field but Executors, defaults applied.
func (c Config) checkSettings() error {
	if c.Namespace != "" {
		if _, err := wire.ParseNamespace(c.Namespace); err != nil {
			return invalidConfig("Namespace", "%s", err)
		}
	}
	switch {
	case c.Concurrency < 1:
		return invalidConfig("Concurrency", "must be at least 1")
	case c.MaxAttempts < 1:
		return invalidConfig("MaxAttempts", "must be at least 1")
	case c.MaxDeliver < 1:
		return invalidConfig("MaxDeliver", "must be at least 1")
	case c.ExecuteTimeout <= 0:
		return invalidConfig("ExecuteTimeout", "must be positive")
	case c.AckWait <= c.ExecuteTimeout:
		return invalidConfig("AckWait", "(%s) must exceed ExecuteTimeout (%s)", c.AckWait, c.ExecuteTimeout)
	case c.KeyLockTimeout < 0:
		return invalidConfig("KeyLockTimeout", "must be positive")
	case c.KeyLockTimeout > 0 && c.KeyLockTimeout <= 2*c.ExecuteTimeout:
		return invalidConfig("KeyLockTimeout", "must be more than twice ExecuteTimeout")
	case c.RetryBase <= 0:
		return invalidConfig("RetryBase", "must be positive")
	case c.RetryMax <= 0:
		return invalidConfig("RetryMax", "must be positive")
	case c.MaxRetryAfter <= 0:
		return invalidConfig("MaxRetryAfter", "must be positive, e.g. 1h")
	case c.LookupSettle <= 0:
		return invalidConfig("LookupSettle", "must be positive")
	case c.Unknown != UnknownHold && c.Unknown != UnknownResend:
		return invalidConfig("Unknown", "must be hold or resend, got %q", c.Unknown)
	}
	return nil
}

// invalidConfig is a bad Config field: a *fenceerr.InvalidError naming it.
func invalidConfig(field, format string, args ...any) error {
	return fmt.Errorf("executor: %w", fenceerr.Invalid(field, format, args...))
}

// Runtime consumes relayed intents from JetStream and executes them through
// the executors, at most once per business idempotency key.
//
// Per message: load the intent from PostgreSQL (the message only points at
// it); skip it if it is terminal; for fence policy execute, record
// superseded if the resource's epoch moved on; then Begin on the key and
// execute, return the stored result, look up, or hold. The message is acked
// only after the outcome is committed in PostgreSQL (a plain ack: if it is
// lost, the redelivery finds the intent terminal and acks again): a crash
// before that commit means redelivery, and
// the key's state makes the redelivery look up instead of executing twice.
type Runtime struct {
	pool   *pgxpool.Pool
	nc     *nats.Conn
	cfg    Config
	store  *idempotency.Store
	outbox *outbox.Client
	m      *runtimeMetrics
	// ns is cfg.Namespace, checked.
	ns wire.Namespace
	// schema is cfg.Schema, checked; intents its intents table.
	schema  pgschema.Schema
	intents intents.Table

	// caps are the executors' declared capabilities, by kind.
	caps map[string]adapters.Capabilities
	// loads batches the intent reads of concurrent deliveries (one
	// statement for many; a read, so no guarantee rests on it), and
	// epochs the execute fence's reads of their resources' epochs.
	loads  *group.Batcher[int64, *outbox.Record]
	epochs *group.Batcher[string, int64]

	// unanswered are the Begins whose answer was lost, by intent
	// (unansweredBegins).
	unanswered unansweredBegins

	// inFlight are the deliveries being handled, by intent: what a stop
	// that gives up waiting names as abandoned (InFlight).
	inFlightMu sync.Mutex
	inFlight   map[int64]InFlightIntent

	// recordLog is persist's outage (PostgreSQL unreachable): the first
	// failure is a warning, the others, one for each intent at each retry,
	// are at debug, until a write succeeds.
	recordLog outagelog.State
	// ackLog is the acks' outage (NATS away while executions finish).
	ackLog outagelog.State

	// life is the runtime's Start/Stop (internal/startstop).
	life startstop.Lifecycle
	// hooks are the tests' hooks (internal/testhook), read from Start's
	// context before anything runs; zero in production.
	hooks testhook.Runtime
}

// NewRuntime returns a runtime. store is the idempotency store; ob reads
// intents. All four are required; a missing one, or a bad cfg field, is a
// *fenceerr.InvalidError naming it (pool, nc, store, ob; Concurrency, …).
func NewRuntime(pool *pgxpool.Pool, nc *nats.Conn, store *idempotency.Store, ob *outbox.Client, cfg Config) (*Runtime, error) {
	// Each is used by every message: refused now, naming the argument,
	// rather than met as a nil pointer by the first one.
	switch {
	case pool == nil:
		return nil, invalidConfig("pool", "must not be nil")
	case nc == nil:
		return nil, invalidConfig("nc", "a NATS connection is required")
	case store == nil:
		return nil, invalidConfig("store", "an idempotency store is required")
	case ob == nil:
		return nil, invalidConfig("ob", "an outbox client is required")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.KeyLockTimeout != 0 && cfg.KeyLockTimeout != store.Config().LockTimeout {
		return nil, invalidConfig("KeyLockTimeout", "(%s) is not the idempotency store's LockTimeout (%s)", cfg.KeyLockTimeout, store.Config().LockTimeout)
	}
	kinds := make([]string, 0, len(cfg.Executors))
	for _, ex := range cfg.Executors {
		kinds = append(kinds, ex.Kind())
	}
	m, err := newRuntimeMetrics(cfg.Registerer, kinds)
	if err != nil {
		return nil, err
	}
	if cfg.Schema == "" {
		cfg.Schema = ob.Schema()
	}
	if cfg.Schema != ob.Schema() {
		return nil, invalidConfig("Schema", "%q is not the outbox client's schema %q", cfg.Schema, ob.Schema())
	}
	schema, err := pgschema.Parse(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	r := &Runtime{pool: pool, nc: nc, cfg: cfg, store: store, outbox: ob, m: m, ns: wire.Namespace(cfg.Namespace), caps: map[string]adapters.Capabilities{},
		schema: schema, intents: intents.In(schema)}
	for _, ex := range cfg.Executors {
		r.caps[ex.Kind()] = ex.Capabilities() // declared once, read once
	}
	r.loads = group.New(group.Config{MaxBatch: 256, Flushers: 2, Timeout: 10 * time.Second}, r.loadBatch)
	r.epochs = group.New(group.Config{MaxBatch: 256, Flushers: 2, Timeout: 10 * time.Second}, r.epochBatch)
	return r, nil
}

// loadBatch reads a batch of intents in one statement; an id that names no
// intent gets outbox.ErrNotFound.
func (r *Runtime) loadBatch(ctx context.Context, ids []int64) []group.Result[*outbox.Record] {
	out := make([]group.Result[*outbox.Record], len(ids))
	if len(ids) == 1 {
		rec, err := r.outbox.Get(ctx, ids[0])
		out[0] = group.Result[*outbox.Record]{Value: rec, Err: err}
		return out
	}
	recs, err := r.outbox.GetMany(ctx, ids)
	return group.Answer(ids, recs, err, outbox.ErrNotFound)
}

// epochBatch reads the current epochs of a batch of resources in one
// statement (the execute fence's checks of concurrent deliveries); a
// resource without a row gets pgx.ErrNoRows.
func (r *Runtime) epochBatch(ctx context.Context, resources []string) []group.Result[int64] {
	epochs := make(map[string]int64, len(resources))
	var res string
	var e int64
	rows, err := r.pool.Query(ctx, r.schema.SQL(`SELECT resource_id, epoch FROM fencegate.resources WHERE resource_id = ANY($1)`), resources)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&res, &e}, func() error { epochs[res] = e; return nil })
	}
	return group.Answer(resources, epochs, err, pgx.ErrNoRows)
}

// Start creates (or updates) a durable pull consumer per kind and starts
// consuming. It waits for the stream to exist (the dispatcher creates it)
// until ctx ends. It returns once consuming.
//
// The runtime runs until Stop, not until ctx ends (in-flight effects are
// not cut short); a second Start is an error.
func (r *Runtime) Start(ctx context.Context) (err error) {
	runCtx, err := r.life.Start(context.WithoutCancel(ctx), "executor: runtime")
	if err != nil {
		return err
	}
	r.hooks = testhook.RuntimeFrom(ctx)
	started := false
	defer func() {
		if !started {
			r.life.Done() // not running: Stop returns, Stopped is closed
		}
	}()
	js, err := jetstream.New(r.nc)
	if err != nil {
		return fmt.Errorf("executor: jetstream: %w", err)
	}
	var stream jetstream.Stream
	for wait := 100 * time.Millisecond; ; wait = min(wait*2, 5*time.Second) {
		stream, err = js.Stream(ctx, r.ns.Stream())
		if err == nil {
			break
		}
		r.cfg.Logger.Info("adapters: waiting for stream", "stream", r.ns.Stream(), "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("executor: stream %s: %w", r.ns.Stream(), err)
		case <-time.After(wait):
		}
	}
	var consumers []jetstream.ConsumeContext
	var wg sync.WaitGroup
	for _, ex := range r.cfg.Executors {
		n := r.cfg.Concurrency
		if c := r.caps[ex.Kind()].Concurrency; c > 0 {
			n = min(n, c)
		}
		cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable:       r.Durable(ex.Kind()),
			FilterSubject: r.ns.Subject(ex.Kind()),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       r.cfg.AckWait,
			MaxDeliver:    r.cfg.MaxDeliver,
			MaxAckPending: n * 4,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			for _, c := range consumers {
				c.Stop()
			}
			return fmt.Errorf("executor: consumer for %s: %w", ex.Kind(), err)
		}
		sem := make(chan struct{}, n)
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
		}, jetstream.PullMaxMessages(n*2), jetstream.PullHeartbeat(pullHeartbeat))
		if err != nil {
			for _, c := range consumers {
				c.Stop()
			}
			return fmt.Errorf("executor: consume %s: %w", ex.Kind(), err)
		}
		consumers = append(consumers, cc)
		r.cfg.Logger.Info("adapters: consuming", "kind", ex.Kind(), "durable", r.Durable(ex.Kind()), "concurrency", n)
	}
	started = true
	go func() {
		defer r.life.Done()
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
func (r *Runtime) Stop() { r.life.Stop() }

// InFlightIntent is a delivery the runtime is handling: its intent, kind
// and since when.
type InFlightIntent struct {
	IntentID int64
	Kind     string
	Since    time.Time
}

// InFlight returns the deliveries being handled now, by intent id. A
// process that stops without waiting for them (its stop bound passed)
// logs them: each may have reached its destination, and its key stays
// owned until the next attempt takes it over and looks it up.
func (r *Runtime) InFlight() []InFlightIntent {
	r.inFlightMu.Lock()
	out := make([]InFlightIntent, 0, len(r.inFlight))
	for _, f := range r.inFlight {
		out = append(out, f)
	}
	r.inFlightMu.Unlock()
	slices.SortFunc(out, func(a, b InFlightIntent) int { return cmp.Compare(a.IntentID, b.IntentID) })
	return out
}

// track notes intent id's delivery as in flight until the returned func.
// Two deliveries of one intent at once (a redelivery while the first
// still runs) are one entry: the first's.
func (r *Runtime) track(id int64, kind string) (untrack func()) {
	r.inFlightMu.Lock()
	defer r.inFlightMu.Unlock()
	if _, dup := r.inFlight[id]; dup {
		return func() {}
	}
	if r.inFlight == nil {
		r.inFlight = map[int64]InFlightIntent{}
	}
	r.inFlight[id] = InFlightIntent{IntentID: id, Kind: kind, Since: time.Now()}
	return func() {
		r.inFlightMu.Lock()
		delete(r.inFlight, id)
		r.inFlightMu.Unlock()
	}
}

// Stopped is closed when the runtime has stopped.
func (r *Runtime) Stopped() <-chan struct{} { return r.life.Stopped() }

// Durable is the name of the durable JetStream consumer of kind's intents.
func (r *Runtime) Durable(kind string) string { return r.ns.Durable(r.cfg.DurablePrefix, kind) }

// pullHeartbeat is the idle heartbeat the consumers' pull requests ask
// for; two missed and the pull is renewed. A pull request can be lost with
// a consumer's leader (one sent during the election, after a reconnect, is
// never answered): with nats.go's default (15 s, half the pull's 30 s
// expiry) the adapters then received nothing for 30 s, while the relay had
// long resumed (test/cluster: outcomes stalled 30 s after a consumer leader
// was killed, relays 5 s). With 2 s, a lost pull is renewed within 4 s.
const pullHeartbeat = 2 * time.Second

// verdict is how a message is settled after its outcome is committed.
type verdict int

const (
	ack verdict = iota
	retry
	term
	// wait: the intent waits for proof (or for a lookup that failed) with
	// its key owned; redelivered after the returned delay (zero: the
	// backoff), and well within the key's lock, so that the redelivery
	// resumes the key before anyone else can take it over.
	wait
)

func (r *Runtime) handle(ctx context.Context, ex adapters.Executor, msg jetstream.Msg) {
	log := r.cfg.Logger.With("kind", ex.Kind())
	// Before anything is loaded: the intent id of another deployment's
	// message names some other intent in this database.
	if r.ns != "" {
		if got := msg.Headers().Get(wire.HeaderNamespace); got != string(r.ns) {
			log.Error("adapters: message of another namespace; terminating it, nothing executed",
				"namespace", r.ns, "message_namespace", got, "subject", msg.Subject(), "intent_id_header", msg.Headers().Get(wire.HeaderIntentID))
			r.m.foreign.WithLabelValues(ex.Kind()).Inc()
			_ = msg.Term()
			return
		}
	}
	id, err := wire.ParseIntentID(msg.Headers().Get(wire.HeaderIntentID))
	if err != nil {
		log.Error("adapters: message without intent id; terminating it", "subject", msg.Subject(), "error", err)
		_ = msg.Term()
		return
	}
	log = log.With("intent_id", id)
	defer r.track(id, ex.Kind())()
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
		// The ack comes only now, after the outcome is committed in
		// PostgreSQL. A plain ack (not waiting for the server's
		// confirmation): if it is lost, the redelivery finds the intent
		// terminal and acks again — PostgreSQL, not the ack, is the truth.
		if err := msg.Ack(); err != nil {
			// NATS away: every message that finishes meanwhile fails its
			// ack; said once (WARN), then DEBUG, and once acks work again.
			level, _ := r.ackLog.Failed("")
			log.Log(context.Background(), level, "adapters: ack failed; the redelivery will find the intent terminal", "error", err)
		} else if r.ackLog.Recovered() {
			r.cfg.Logger.Info("adapters: acks work again")
		}
	case retry:
		_ = msg.NakWithDelay(cmp.Or(delay, r.delay(msg)))
	case wait:
		// Well within the key's lock, so that this intent's redelivery
		// resumes the key before anyone else can take it over.
		_ = msg.NakWithDelay(min(cmp.Or(delay, r.delay(msg)), r.store.Config().LockTimeout/2))
	case term:
		_ = msg.Term()
	}
}

// delay is the redelivery delay after the n-th delivery: exponential with
// full jitter, between RetryBase/2 and RetryMax.
func (r *Runtime) delay(msg jetstream.Msg) time.Duration {
	n := 1
	if md, err := msg.Metadata(); err == nil {
		n = int(min(md.NumDelivered, 1<<16))
	}
	return r.backoff(n)
}

// backoff is the delay after the n-th try (from 1): RetryBase doubled per
// try up to RetryMax, with full jitter (between half and all of it).
func (r *Runtime) backoff(n int) time.Duration {
	d := r.cfg.RetryBase
	for i := 1; i < n && d < r.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.RetryMax)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// tracerName is the instrumentation scope of the runtime's spans. It stays
// the adapters package's path, which trace queries select the execution
// spans by.
const tracerName = "github.com/fencegate/fencegate/adapters"

func (r *Runtime) process(ctx context.Context, ex adapters.Executor, id int64, log *slog.Logger) (v verdict, delay time.Duration, err error) {
	rec, err := r.loads.Do(ctx, id)
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
	if rec.NotBefore != nil {
		// A deferred retry (a destination's Retry-After, the backoff) is
		// not executed before it is due, whichever copy of its message
		// arrives early (a redelivery, a relay of the intent again).
		if early := time.Until(*rec.NotBefore); early > 0 {
			r.m.outcomes.WithLabelValues(ex.Kind(), "not_due").Inc()
			return retry, early + 10*time.Millisecond, nil
		}
	}
	// Settle latency: commit → outcome recorded, for the intents this
	// delivery settles (an ack after a non-terminal load).
	defer func() {
		if err == nil && v == ack {
			r.m.settle.WithLabelValues(ex.Kind()).Observe(time.Since(rec.CreatedAt).Seconds())
		}
	}()
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
	ctx = withAttemptNote(ctx)
	note := noteOf(ctx)
	defer func() { endExecuteSpan(span, note, err) }()
	req := adapters.Request{IntentID: rec.IntentID, Resource: rec.Resource, Epoch: rec.Epoch, Kind: rec.Kind,
		IdempotencyKey: rec.IdempotencyKey, Fence: rec.Fence, Payload: rec.Payload}
	log = withContext(log, ctx).With("resource", rec.Resource, "epoch", rec.Epoch, "key", rec.IdempotencyKey)
	if h := r.hooks.AfterLoad; h != nil {
		h(req.IntentID)
	}

	// Fence policy execute: re-check authority now. An intent whose
	// resource moved on is superseded, never executed. (A destination that
	// can check, like the file adapter, checks again at the write.)
	var fencedBy int64
	if rec.Fence == outbox.FenceExecute {
		// One statement for the checks of concurrent deliveries
		// (epochBatch), read now: after the intent, before its Begin.
		current, err := r.epochs.Do(ctx, rec.Resource)
		if err != nil {
			return 0, 0, fmt.Errorf("read resource epoch: %w", err)
		}
		if h := r.hooks.FenceChecked; h != nil {
			h(id, current)
		}
		if current > rec.Epoch {
			// Superseded without executing only if no attempt of this
			// intent has begun — decided in SQL under the intent's row
			// lock, not from rec.Attempts: that read is stale when another
			// delivery of the same intent began an attempt since, and
			// calling it superseded would contradict the effect that
			// attempt performs.
			c, superseded, err := r.store.SupersedeUnstarted(ctx, id)
			if err != nil {
				return 0, 0, err
			}
			if superseded {
				r.m.stale.WithLabelValues(fencemetrics.WhereExecuteFence).Inc()
				log.Info("adapters: superseded before execution", "current_epoch", c)
				r.m.outcomes.WithLabelValues(ex.Kind(), "superseded").Inc()
				noteOutcome(ctx, string(outbox.StatusSuperseded), "")
				return ack, 0, nil
			}
			// An attempt of this intent has begun (or it is final: Begin
			// says so). It may have performed the effect before the
			// resource moved on, and crashed before recording it: calling
			// it superseded would record an effect that happened as one
			// that never did, and leave its key started. Go through the
			// key: never execute, but find out.
			fencedBy = current
		}
	}

	fp := idempotency.Fingerprint(rec.Kind, rec.Payload)
	// BeginRecording: the answers that never execute (Done, Conflict, a
	// held key) record the intent's status in Begin's own transaction, on
	// the key's state as it is then, not on a reading of it that a later
	// transaction would act on.
	//
	// A Begin whose answer is lost (the primary failing over as it
	// commits) may have created the key, owned by this intent until its
	// lock expires (Config.KeyLockTimeout, minutes): its nonce is kept,
	// and the next Begin of the intent here takes such a key back at once
	// (idempotency.BeginOptions), since no decision of it was acted on.
	bo := r.unanswered.options(id)
	d, err := r.store.BeginRecordingWith(ctx, rec.Kind, rec.IdempotencyKey, fp, id, bo)
	if errors.Is(err, idempotency.ErrIntentTerminal) {
		// Cancelled (or completed) between our read and Begin: nothing to do.
		r.unanswered.answered(id)
		noteOutcome(ctx, "already_terminal", "")
		return ack, 0, nil
	}
	if err != nil {
		r.unanswered.lost(id, bo.Nonce, r.cfg.KeyLockTimeout)
		return 0, 0, fmt.Errorf("begin: %w", err)
	}
	r.unanswered.answered(id)
	if bo.Unanswered != 0 {
		log.Info("adapters: begun again after a Begin whose answer was lost", "outcome", d.Outcome)
	}
	req.Attempt = d.Attempts
	token := d.Token
	req = req.WithOwnerCheck(func(ctx context.Context) error {
		return r.store.CheckOwner(ctx, req.Kind, req.IdempotencyKey, token)
	})
	switch d.Outcome {
	case idempotency.OutcomeDone:
		// The effect already happened (or failed for good) under this key,
		// possibly for another intent: the stored result was recorded.
		r.notRecorded(ex.Kind(), !d.IntentRecorded, log)
		r.m.outcomes.WithLabelValues(ex.Kind(), "done_before").Inc()
		noteEnd(ctx, "done_before", d.Status, fmt.Sprintf("idempotency key %q already completed (%s) by intent %d", rec.IdempotencyKey, d.Status, d.OwnerIntentID))
		log.Info("adapters: key already completed; recorded the stored result", "status", d.Status, "owner_intent_id", d.OwnerIntentID)
		return ack, 0, nil
	case idempotency.OutcomeConflict:
		r.notRecorded(ex.Kind(), !d.IntentRecorded, log)
		r.m.outcomes.WithLabelValues(ex.Kind(), "conflict").Inc()
		noteEnd(ctx, "conflict", outbox.StatusFailed, idempotency.ConflictMessage(rec.IdempotencyKey, d.OwnerIntentID))
		log.Warn("adapters: " + idempotency.ConflictMessage(rec.IdempotencyKey, d.OwnerIntentID))
		return ack, 0, nil
	case idempotency.OutcomeBusy:
		if d.Held {
			// Held with an unknown outcome (another intent of the same key):
			// this intent's fate is the same unknown (recorded).
			r.notRecorded(ex.Kind(), !d.IntentRecorded, log)
			noteOutcome(ctx, string(outbox.StatusUnknown), idempotency.HeldMessage(rec.IdempotencyKey, d.OwnerIntentID))
			return ack, 0, nil
		}
		r.m.outcomes.WithLabelValues(ex.Kind(), "busy").Inc()
		noteOutcome(ctx, "busy", "")
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
			return r.complete(ctx, req, d, adapters.Outcome{Status: outbox.StatusSuperseded, Result: supersededResult(fencedBy)}, "")
		}
		return r.execute(ctx, ex, req, d, log)
	}
	return 0, 0, fmt.Errorf("begin: unexpected outcome %q", d.Outcome)
}

// endExecuteSpan ends a delivery's execute span with how it ended
// (fencegate.outcome: note's outcome, the attempt history's word for it)
// and its status: Error when the delivery recorded the intent failed or
// unknown, described by the error text it recorded (last_error, what the
// log says: the adapters keep credentials and URL queries out of it), or
// when it was not settled (err, an internal error: redelivered; no
// outcome, whatever the attempt was about to record).
func endExecuteSpan(span trace.Span, note *attemptNote, err error) {
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	case note.outcome != "":
		span.SetAttributes(attribute.String("fencegate.outcome", note.outcome))
		if note.status == outbox.StatusFailed || note.status == outbox.StatusUnknown {
			span.SetStatus(codes.Error, cmp.Or(note.msg, "intent "+string(note.status)))
		}
	}
	span.End()
}

// canLookup says whether req's outcome can be looked up at its
// destination, and with what.
func (r *Runtime) canLookup(ex adapters.Executor, req adapters.Request) (adapters.Looker, bool) {
	caps := r.caps[ex.Kind()]
	if !caps.Lookup || (caps.ForRequest != nil && !caps.ForRequest(req).Lookup) {
		return nil, false
	}
	l, ok := ex.(adapters.Looker)
	return l, ok
}

// resends says whether an unknown outcome of req, which cannot be looked
// up, is executed again with the same key: only where the destination
// dedups on it, and then under the resend policy — or always, where the
// executor says so for this one destination (ForRequest; an operator
// listed it).
func (r *Runtime) resends(ex adapters.Executor, req adapters.Request) bool {
	caps := r.caps[ex.Kind()]
	if caps.ForRequest != nil {
		return caps.ForRequest(req).DedupsOnKey
	}
	return r.cfg.Unknown == UnknownResend && caps.DedupsOnKey
}

func (r *Runtime) recoverAttempt(ctx context.Context, ex adapters.Executor, req adapters.Request, d idempotency.Decision, log *slog.Logger) (verdict, time.Duration, error) {
	if l, ok := r.canLookup(ex, req); ok {
		return r.lookupOrWait(ctx, ex, l, req, d, log, func() (verdict, time.Duration, error) {
			// The destination has no trace of it, and had time to show
			// it: the abandoned attempt did not perform the effect.
			// Execute now, as the owner.
			return r.executeRecovered(ctx, ex, req, d, true, log)
		})
	}
	if r.resends(ex, req) {
		return r.executeRecovered(ctx, ex, req, d, false, log)
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
func (r *Runtime) recoverFenced(ctx context.Context, ex adapters.Executor, req adapters.Request, d idempotency.Decision, current int64, log *slog.Logger) (verdict, time.Duration, error) {
	l, ok := r.canLookup(ex, req)
	if !ok {
		return r.hold(ctx, req, d, fmt.Sprintf("an earlier attempt was abandoned, the resource moved on to epoch %d, and the destination offers no lookup", current), log)
	}
	return r.lookupOrWait(ctx, ex, l, req, d, log, func() (verdict, time.Duration, error) {
		r.m.stale.WithLabelValues(fencemetrics.WhereExecuteFence).Inc()
		log.Info("adapters: superseded before execution", "current_epoch", current)
		r.m.outcomes.WithLabelValues(ex.Kind(), "superseded").Inc()
		// Proven: no attempt under the key performed the effect.
		return r.recordProven(ctx, req, d, adapters.Outcome{Status: outbox.StatusSuperseded, Result: supersededResult(current)})
	})
}

// settleFor is the settle window of ex's destination.
func (r *Runtime) settleFor(ex adapters.Executor) time.Duration {
	return cmp.Or(r.caps[ex.Kind()].LookupSettle, r.cfg.LookupSettle)
}

// lookupOrWait looks the outcome of the key's earlier attempts up, as the
// key's owner (d.Token), after their I/O with the destination ended (EndIO)
// or was cut off by a takeover. A lookup that finds the effect is trusted at
// once and recorded. One that finds nothing is proof that the effect did not
// happen only once the settle window has passed since the last I/O; then
// onProof runs. Until then the intent waits: the key stays owned (its lock
// renewed by AwaitProof), the intent says what it waits for, and the
// redelivery looks up again — nothing is executed or released meanwhile.
func (r *Runtime) lookupOrWait(ctx context.Context, ex adapters.Executor, l adapters.Looker, req adapters.Request, d idempotency.Decision, log *slog.Logger,
	onProof func() (verdict, time.Duration, error)) (verdict, time.Duration, error) {
	settle := r.settleFor(ex)
	// The window is judged BEFORE the lookup starts: a lookup that began
	// inside the window proves nothing, even if its answer arrives after
	// the window ended (the destination may have shown the effect a moment
	// after it answered).
	var p idempotency.Proof
	err := r.persist(ctx, func() error {
		var err error
		p, err = r.store.AwaitProof(ctx, req.Kind, req.IdempotencyKey, d.Token, settle)
		return err
	})
	if errors.Is(err, idempotency.ErrLostOwnership) {
		// Another attempt owns the key now (a redelivery of this intent
		// resumed it, or our lock expired): it looks up and decides.
		r.recordAttempt(ctx, req, d, idempotency.AttemptLostKey, "")
		return retry, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("await proof: %w", err)
	}
	lctx, cancel := context.WithTimeout(ctx, r.cfg.ExecuteTimeout)
	out, found, err := r.callLookup(lctx, ex, l, req, log)
	cancel()
	// A found outcome that breaks the SPI is recorded truthfully
	// (checkFound): a bad result replaced; a bad status held unknown.
	var lookupBug string
	if found && err == nil {
		out, lookupBug = r.checkFound(ex, out, log)
	}
	r.m.lookups.WithLabelValues(ex.Kind(), lookupResult(found, err)).Inc()
	noteLookup(ctx, found, err)
	if err != nil && adapters.IsPermanent(err) {
		// The lookup can never answer (it refuses our credentials, the
		// lookup endpoint does not exist): waiting would keep the intent
		// relayed, looked up for ever, with no operator action that
		// applies. Held unknown (the key stays held, the effect possible)
		// for an operator to resolve. The hold records the attempt (as
		// unknown, with the refusal): a row recorded here first would
		// take its place in the history.
		return r.hold(ctx, req, d, "the lookup at the destination was refused for good, so it cannot settle whether the effect happened: "+err.Error(), log)
	}
	if err != nil {
		// Can't tell yet. Keep the key owned (never Release: that would
		// say the effect did not happen); the redelivery resumes the key
		// and looks up again. Say so on the intent, as a wait for proof
		// does (its effect possible): a lookup that keeps failing (the
		// lookup endpoint down or misconfigured) otherwise left the
		// intent relayed, with no last_error and effect none, for as
		// long as it failed.
		log.Warn("adapters: lookup failed; will look up again", "error", err)
		msg := fmt.Sprintf("waiting for proof: the lookup at the destination failed, and is tried again: %v", err)
		if _, nerr := r.store.NoteWaiting(ctx, req.IntentID, msg); nerr != nil {
			log.Warn("adapters: record the failed lookup on the intent", "error", nerr)
		}
		r.recordAttempt(ctx, req, d, idempotency.AttemptLookupFailed, err.Error())
		return wait, 0, nil
	}
	if found && lookupBug != "" {
		return r.complete(ctx, req, d, out, lookupBug)
	}
	if found && out.Status == outbox.StatusUnknown {
		// The destination has a trace that proves neither way (the s3
		// adapter's unsigned receipt): held for an operator, recorded as
		// it is — never succeeded, never executed again.
		log.Warn("adapters: the lookup cannot settle whether the effect happened; holding the intent unknown", "result", string(out.Result))
		r.m.outcomes.WithLabelValues(ex.Kind(), "held_by_lookup").Inc()
		return r.complete(ctx, req, d, out, "the lookup cannot settle whether the effect happened: held for an operator")
	}
	if found {
		log.Info("adapters: recovered: the effect had happened; recording it")
		r.m.outcomes.WithLabelValues(ex.Kind(), "recovered_by_lookup").Inc()
		return r.complete(ctx, req, d, out, "")
	}
	if p.Settled {
		return onProof()
	}
	msg := fmt.Sprintf("waiting for proof: lookup found nothing; a negative lookup is trusted after %s (%s after the last I/O with the destination, %s)",
		p.TrustedAfter.UTC().Format(time.RFC3339), settle, p.LastIOAt.UTC().Format(time.RFC3339))
	if _, err := r.store.NoteWaiting(ctx, req.IntentID, msg); err != nil {
		log.Warn("adapters: record the wait on the intent", "error", err)
	}
	r.recordAttempt(ctx, req, d, idempotency.AttemptWaitingForProof, msg)
	r.m.outcomes.WithLabelValues(ex.Kind(), "waiting_for_proof").Inc()
	log.Info("adapters: lookup found nothing; not proof yet, waiting", "trusted_after", p.TrustedAfter, "remaining", p.Remaining)
	return wait, waitDelay(p, settle, r.cfg.RetryBase), nil
}

// waitDelay is when to look up again while waiting for proof: after as long
// as has passed since the last I/O (so lookups come at doubling intervals —
// soon after the I/O, when a late effect is most likely to show, then
// rarer: about log2(settle/base) lookups over the window, which keeps the
// redeliveries well inside the consumer's MaxDeliver; past it the
// dispatcher's re-relay brings the intent back), at least base, at most a
// quarter of the window, and no later than the proof is due (a margin past
// it, so the redelivery does not arrive a hair early).
func waitDelay(p idempotency.Proof, settle, base time.Duration) time.Duration {
	elapsed := max(settle-p.Remaining, 0)
	d := max(elapsed, base)
	d = min(d, max(settle/4, base))
	return min(d, p.Remaining+10*time.Millisecond)
}

// executeRecovered executes as the owner of a key it recovered, once that
// is allowed (proof that the earlier attempts did not perform the effect,
// or a destination that dedups). BeginIO first, committed before any I/O:
// it marks the key's I/O as in progress, so that a takeover measures its
// settle window from its own time instead of the earlier attempts' end.
//
// proven: a lookup after the settle window proved that no earlier attempt
// performed the effect; the intent's effect becomes none again (in BeginIO's
// transaction), so that this attempt's failure may end it failed. Without
// proof (a destination that dedups, resent to) the effect stays possible.
func (r *Runtime) executeRecovered(ctx context.Context, ex adapters.Executor, req adapters.Request, d idempotency.Decision, proven bool, log *slog.Logger) (verdict, time.Duration, error) {
	// A resumed key's Begin counted no attempt (it only looked up); this
	// execution is one.
	var n int
	err := r.persist(ctx, func() error {
		var err error
		if proven {
			n, err = r.store.BeginIOAfterProof(ctx, req.Kind, req.IdempotencyKey, d.Token, req.IntentID, d.Resumed)
		} else {
			n, err = r.store.BeginIO(ctx, req.Kind, req.IdempotencyKey, d.Token, req.IntentID, d.Resumed)
		}
		return err
	})
	if errors.Is(err, idempotency.ErrLostOwnership) {
		r.recordAttempt(ctx, req, d, idempotency.AttemptLostKey, "")
		return retry, 0, nil // the new owner decides
	}
	if errors.Is(err, idempotency.ErrIntentTerminal) {
		// Cancelled meanwhile. The proof stands (nothing happened under
		// the key): give the key back, so that another intent with it
		// executes at once instead of recovering.
		if err := r.persist(ctx, func() error { return r.store.Release(ctx, req.Kind, req.IdempotencyKey, d.Token) }); err != nil && !errors.Is(err, idempotency.ErrLostOwnership) {
			return 0, 0, fmt.Errorf("release key: %w", err)
		}
		return ack, 0, nil
	}
	var de *idempotency.DeferredError
	if errors.As(err, &de) {
		// An early redelivery of an intent whose attempt kept the key for
		// a retry (KeepForRetry): its retry is not due yet. Nothing was
		// written; keep the key (an earlier attempt may have performed
		// the effect) and come back when the retry is due.
		log.Info("adapters: the intent's next attempt is not due yet; coming back then", "in", de.Remaining)
		return retry, max(de.Remaining, r.cfg.RetryBase), nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("begin I/O: %w", err)
	}
	if d.Resumed {
		// BeginIO counted this execution: the attempt starts now.
		req.Attempt, d.Attempts, d.CountedAt = n, n, time.Now()
	}
	if proven && d.Effect == outbox.EffectPossible {
		d.Effect = outbox.EffectNone
	}
	return r.execute(ctx, ex, req, d, log)
}

// notRecorded counts an outcome the runtime could not record on its intent
// because the intent already had a final status (the store put it in the
// intent's history).
func (r *Runtime) notRecorded(kind string, yes bool, log *slog.Logger) {
	if !yes {
		return
	}
	r.m.notRecorded.WithLabelValues(kind).Inc()
	log.Warn("adapters: the intent already had a final status; the outcome is in its history, not its status")
}

func (r *Runtime) execute(ctx context.Context, ex adapters.Executor, req adapters.Request, d idempotency.Decision, log *slog.Logger) (verdict, time.Duration, error) {
	ectx, cancel := context.WithTimeout(ctx, r.cfg.ExecuteTimeout)
	start := time.Now()
	// A panic is recovered as an unknown outcome (callExecute).
	out, err := r.callExecute(ectx, ex, req, log)
	cancel()
	// An outcome that breaks the SPI is recorded truthfully (checkOutcome):
	// a bad result replaced, and noted; a status Execute may not return is
	// an unknown outcome.
	var note string
	if err == nil {
		out, note, err = r.checkOutcome(ex, req, out, log)
	}
	noteCause(ctx, err)
	r.m.duration.WithLabelValues(ex.Kind()).Observe(time.Since(start).Seconds())
	if h := r.hooks.AfterEffect; h != nil {
		h(req.IntentID)
	}
	failpoint.Inject(failpoint.AfterEffectBeforeRecord) // no-op unless built with -tags failpoints
	var bug *adapterBugError
	switch {
	case err == nil:
		r.m.outcomes.WithLabelValues(ex.Kind(), string(out.Status)).Inc()
		// Debug: the outcome of every intent is in PostgreSQL (status,
		// history); a line per effect at info costs a formatted write per
		// intent at thousands a second.
		log.Debug("adapters: executed", "status", out.Status, "attempt", req.Attempt)
		return r.record(ctx, req, d, out, note, true)
	case adapters.IsUnknown(err) || (!adapters.IsRetryable(err) && !adapters.IsPermanent(err)):
		// Explicitly unknown, or not classified at all: an error the
		// adapter did not classify may come after the request reached the
		// destination, so it is never taken as "did not happen". So is an
		// adapter's bug met after the key was begun (a panic, a status
		// Execute may not return), already logged at ERROR.
		l, lookup := r.canLookup(ex, req)
		switch {
		case errors.As(err, &bug):
		case adapters.IsUnknown(err):
			// Without a lookup the hold's or the resend's own WARN says
			// it, with the error: one line an outcome, not two.
			level := slog.LevelDebug
			if lookup {
				level = slog.LevelWarn
			}
			log.Log(ctx, level, "adapters: outcome unknown", "error", err)
		default:
			log.Warn("adapters: executor error not classified (RetryableError, PermanentError or UnknownError); taken as an unknown outcome", "error", err)
		}
		if lookup {
			// Execute returned: this attempt's I/O with the destination is
			// over. Record when, on the key, before looking up: the settle
			// window is measured from it, by whoever looks up next, even
			// if this process dies now. (If this write is lost, a takeover
			// measures from its own, later, time.)
			ierr := r.persist(ctx, func() error {
				_, err := r.store.EndIO(ctx, req.Kind, req.IdempotencyKey, d.Token)
				return err
			})
			if errors.Is(ierr, idempotency.ErrLostOwnership) {
				r.recordAttempt(ctx, req, d, idempotency.AttemptLostKey, err.Error())
				return retry, 0, nil // taken over: the new owner looks up
			}
			if ierr != nil {
				return 0, 0, fmt.Errorf("record end of I/O: %w", ierr)
			}
			cause := err
			return r.lookupOrWait(ctx, ex, l, req, d, log, func() (verdict, time.Duration, error) {
				// Looked up after the settle window and not there: it
				// did not happen, under any attempt of the key. Retry.
				return r.retryable(ctx, ex, req, d, cause, true, log)
			})
		}
		if r.resends(ex, req) {
			return r.resendLater(ctx, ex, req, d, err, log)
		}
		return r.hold(ctx, req, d, err.Error(), log)
	case adapters.IsRetryable(err):
		return r.retryable(ctx, ex, req, d, err, false, log)
	case d.Effect == outbox.EffectPossible:
		// A permanent refusal now says nothing of an earlier attempt whose
		// outcome is unknown: the effect may have happened. Never failed.
		return r.hold(ctx, req, d, fmt.Sprintf("%v (an earlier attempt's outcome is unknown: the effect may have happened)", err), log)
	default:
		r.m.outcomes.WithLabelValues(ex.Kind(), "failed").Inc()
		log.Warn("adapters: permanent error; intent failed", "error", err)
		return r.complete(ctx, req, d, adapters.Outcome{Status: outbox.StatusFailed}, err.Error())
	}
}

// retryable handles an attempt that definitely did not perform the effect
// (a refusal, nothing sent), or one whose lookup proved, after the settle
// window, that no attempt under the key performed it (proven).
//
// Where the intent's effect is possible otherwise — an earlier attempt's
// outcome is unknown — the key is kept (keepForRetry): releasing it would
// say that nothing happened under it. Otherwise the key is given back and
// the retry deferred in one write, so that the next attempt gets Execute.
// Either way the retry's due time is written on the intent (not_before)
// before the message is settled, so that the dispatcher never relays it
// again earlier.
func (r *Runtime) retryable(ctx context.Context, ex adapters.Executor, req adapters.Request, d idempotency.Decision, cause error, proven bool, log *slog.Logger) (verdict, time.Duration, error) {
	if d.Effect == outbox.EffectPossible && !proven {
		if req.Attempt >= r.cfg.MaxAttempts {
			return r.hold(ctx, req, d, fmt.Sprintf("gave up after %d attempts: %v (an earlier attempt's outcome is unknown: the effect may have happened)", req.Attempt, cause), log)
		}
		return r.keepForRetry(ctx, ex, req, d, cause, false, log)
	}
	delay := r.retryDelay(req.Attempt, cause)
	att := r.attempt(ctx, req, d, idempotency.AttemptRetry, cause.Error())
	if att != nil {
		att.Delay = delay
		if req.Attempt >= r.cfg.MaxAttempts {
			// The last attempt: CompleteIntent below ends the intent failed.
			att.Outcome, att.Delay = string(outbox.StatusFailed), 0
		}
	}
	retry1 := idempotency.Retry{Kind: req.Kind, Key: req.IdempotencyKey, Token: d.Token, IntentID: req.IntentID, Error: cause.Error(), Delay: delay, Attempt: att}
	err := r.persist(ctx, func() error { return r.store.ReleaseForRetry(ctx, retry1, proven) })
	if errors.Is(err, idempotency.ErrLostOwnership) {
		// Another attempt owns the key (ours was taken over, e.g. while
		// an executor stopped at StillOwner): it decides.
		log.Info("adapters: retryable error after the key was taken over; leaving it to the owner", "error", cause)
		r.recordAttempt(ctx, req, d, idempotency.AttemptLostKey, cause.Error())
		return retry, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("release key: %w", err)
	}
	if req.Attempt >= r.cfg.MaxAttempts {
		// failed: no attempt of this intent can have performed the effect
		// (none had an unknown outcome, or a lookup proved it).
		msg := fmt.Sprintf("gave up after %d attempts: %v", req.Attempt, cause)
		r.m.outcomes.WithLabelValues(ex.Kind(), "failed").Inc()
		log.Warn("adapters: attempts exhausted; intent failed (an operator can retry it)", "attempts", req.Attempt, "error", cause)
		updated, err := r.store.CompleteIntent(ctx, req.IntentID, outbox.StatusFailed, nil, msg)
		if err != nil && !errors.Is(err, idempotency.ErrIntentTerminal) {
			return 0, 0, err
		}
		noteOutcome(ctx, string(outbox.StatusFailed), msg)
		r.notRecorded(ex.Kind(), err == nil && !updated, log)
		return ack, 0, nil
	}
	r.m.outcomes.WithLabelValues(ex.Kind(), "retry").Inc()
	log.Info("adapters: retryable error; will retry", "attempt", req.Attempt, "in", delay, "error", cause)
	return retry, delay, nil
}

// resendLater handles an unknown outcome at a destination that dedups on
// the key (the resend policy, or a destination an operator listed): the
// effect may have happened, so the key is kept and the intent's effect
// marked possible; the next attempt sends again with the same key. When
// attempts run out the intent is held unknown, never failed.
func (r *Runtime) resendLater(ctx context.Context, ex adapters.Executor, req adapters.Request, d idempotency.Decision, cause error, log *slog.Logger) (verdict, time.Duration, error) {
	if req.Attempt >= r.cfg.MaxAttempts {
		return r.hold(ctx, req, d, fmt.Sprintf("outcome unknown after %d attempts, the last: %v", req.Attempt, cause), log)
	}
	return r.keepForRetry(ctx, ex, req, d, cause, true, log)
}

// keepForRetry defers the intent's next attempt while this attempt keeps
// the key (idempotency.Store.KeepForRetry): the redelivery resumes the key
// and, since an earlier attempt may have performed the effect, recovers —
// looks up where the destination can, resends where it dedups, else holds.
// possible marks the intent's effect possible (this attempt's outcome is
// unknown).
func (r *Runtime) keepForRetry(ctx context.Context, ex adapters.Executor, req adapters.Request, d idempotency.Decision, cause error, possible bool, log *slog.Logger) (verdict, time.Duration, error) {
	delay := r.retryDelay(req.Attempt, cause)
	att := r.attempt(ctx, req, d, idempotency.AttemptRetryKeyKept, cause.Error())
	if att != nil {
		att.Delay = delay
	}
	k := idempotency.Retry{Kind: req.Kind, Key: req.IdempotencyKey, Token: d.Token, IntentID: req.IntentID, Error: cause.Error(), Delay: delay, Attempt: att}
	err := r.persist(ctx, func() error { return r.store.KeepForRetry(ctx, k, possible) })
	if errors.Is(err, idempotency.ErrLostOwnership) {
		log.Info("adapters: the key was taken over before the retry was deferred; leaving it to the owner", "error", cause)
		r.recordAttempt(ctx, req, d, idempotency.AttemptLostKey, cause.Error())
		return retry, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("keep key for a retry: %w", err)
	}
	r.m.outcomes.WithLabelValues(ex.Kind(), "retry_key_kept").Inc()
	log.Warn("adapters: the effect may have happened; keeping the key and retrying with it", "attempt", req.Attempt, "in", delay, "error", cause)
	return retry, delay, nil
}

// retryDelay is how long after attempt n (from 1) the next one is due: the
// destination's Retry-After (at least RetryBase, at most MaxRetryAfter),
// else the backoff by attempt.
func (r *Runtime) retryDelay(n int, cause error) time.Duration {
	var e *adapters.Error
	if errors.As(cause, &e) && e.RetryAfter > 0 {
		return min(max(e.RetryAfter, r.cfg.RetryBase), r.cfg.MaxRetryAfter)
	}
	return r.backoff(n)
}

func (r *Runtime) hold(ctx context.Context, req adapters.Request, d idempotency.Decision, why string, log *slog.Logger) (verdict, time.Duration, error) {
	r.m.outcomes.WithLabelValues(req.Kind, "unknown").Inc()
	log.Warn("adapters: outcome unknown and cannot be looked up; holding for an operator", "reason", why)
	return r.complete(ctx, req, d, adapters.Outcome{Status: outbox.StatusUnknown}, why)
}

// complete records an outcome this attempt found out or decided (a lookup,
// superseded, held, a permanent failure), not one of an effect it performed.
func (r *Runtime) complete(ctx context.Context, req adapters.Request, d idempotency.Decision, out adapters.Outcome, errMsg string) (verdict, time.Duration, error) {
	return r.record(ctx, req, d, out, errMsg, false)
}

// recordProven is complete for an outcome decided once a lookup after the
// settle window proved that no attempt under the key performed the effect:
// the intent's effect, if marked possible, becomes none with it.
func (r *Runtime) recordProven(ctx context.Context, req adapters.Request, d idempotency.Decision, out adapters.Outcome) (verdict, time.Duration, error) {
	return r.recordCompletion(ctx, req, d, out, "", false, true)
}

// record records the outcome under the key and on the intent; performed says
// the outcome is that of an effect this very attempt performed (Execute
// returned it), as opposed to one it found out.
func (r *Runtime) record(ctx context.Context, req adapters.Request, d idempotency.Decision, out adapters.Outcome, errMsg string, performed bool) (verdict, time.Duration, error) {
	return r.recordCompletion(ctx, req, d, out, errMsg, performed, false)
}

func (r *Runtime) recordCompletion(ctx context.Context, req adapters.Request, d idempotency.Decision, out adapters.Outcome, errMsg string, performed, proven bool) (verdict, time.Duration, error) {
	var res idempotency.CompleteResult
	err := r.persist(ctx, func() error {
		var err error
		res, err = r.store.CompleteOutcome(ctx, idempotency.Completion{
			Kind: req.Kind, Key: req.IdempotencyKey, Token: d.Token, IntentID: req.IntentID,
			Status: out.Status, Result: out.Result, Error: errMsg, Proven: proven,
			Attempt: r.attempt(ctx, req, d, string(out.Status), errMsg),
		})
		return err
	})
	if errors.Is(err, idempotency.ErrLostOwnership) {
		// Another attempt took the key over (our lock expired mid-effect):
		// its Begin answered Recover and it looks the outcome up. Let the
		// redelivery find out what it recorded.
		if performed && out.Status == outbox.StatusSucceeded {
			// But this attempt knows the effect happened, after it lost
			// the key: where the destination cannot dedup, the new owner
			// may perform it again. Never let that pass silently.
			r.effectAfterLostOwnership(ctx, req, d, out, err)
		}
		r.recordAttempt(ctx, req, d, idempotency.AttemptLostKey, errMsg)
		return retry, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("record outcome: %w", err)
	}
	r.notRecorded(req.Kind, res.NotRecorded, r.cfg.Logger.With("kind", req.Kind, "intent_id", req.IntentID))
	return ack, 0, nil
}

// effectAfterLostOwnership records, in the intent's history and a metric,
// an effect that completed after its attempt lost the idempotency key.
func (r *Runtime) effectAfterLostOwnership(ctx context.Context, req adapters.Request, d idempotency.Decision, out adapters.Outcome, cause error) {
	r.m.lostOwnership.WithLabelValues(req.Kind).Inc()
	note := fmt.Sprintf("the effect completed (%s) after this attempt (token %d) had lost its idempotency key: %v; "+
		"the attempt that took the key over decides the intent's status, and may perform the effect again where the destination cannot dedup",
		out.Status, d.Token, cause)
	if len(out.Result) > 0 {
		note += "; result " + string(out.Result)
	}
	r.cfg.Logger.Error("adapters: effect completed after the attempt lost its idempotency key", "kind", req.Kind,
		"intent_id", req.IntentID, "key", req.IdempotencyKey, "token", d.Token, "result", string(out.Result))
	if err := r.persist(ctx, func() error {
		return r.store.RecordEvent(ctx, req.IntentID, idempotency.EventEffectAfterLostOwnership, note)
	}); err != nil {
		r.cfg.Logger.Error("adapters: could not record the effect after lost ownership in the intent's history", "intent_id", req.IntentID, "error", err)
	}
}

// persist runs a write that records what this attempt knows (an outcome,
// a release), retrying it with backoff while PostgreSQL is unreachable —
// restarting, failing over — for up to persistWindow. Giving up leaves the
// key owned by this attempt until its lock expires (LockTimeout), and the
// intent waits that long for a recovery that looks up what this attempt
// already knew — or, where the destination offers no lookup, holds it
// unknown for an operator. Completing and releasing are idempotent for the
// same token, so a retry after a lost answer is safe. Ownership, validation
// and final-intent errors are not retried.
func (r *Runtime) persist(ctx context.Context, write func() error) error {
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(2*time.Second),
		backoff.WithMaxElapsedTime(r.persistWindow()),
	)
	for {
		err := write()
		if err == nil || errors.Is(err, idempotency.ErrLostOwnership) || errors.Is(err, idempotency.ErrInvalid) ||
			errors.Is(err, idempotency.ErrIntentNotFound) || errors.Is(err, idempotency.ErrIntentTerminal) ||
			errors.Is(err, idempotency.ErrDeferred) {
			if err == nil && r.recordLog.Recovered() {
				r.cfg.Logger.Info("adapters: recording works again")
			}
			return err
		}
		wait := bo.NextBackOff()
		if wait == backoff.Stop {
			return err
		}
		// Once per outage at warn, not once per intent and retry: with
		// hundreds of executions in flight that was thousands of lines.
		level, _ := r.recordLog.Failed("")
		r.cfg.Logger.Log(ctx, level, "adapters: recording failed; retrying", "error", err, "in", wait, "for_up_to", r.persistWindow())
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// persistWindow is how long persist retries a write while PostgreSQL is
// unreachable: half the key's lock (LockTimeout). The key was locked for
// LockTimeout when the attempt began and Execute took less than half of
// it (LockTimeout must exceed twice ExecuteTimeout), so an outcome known
// when Execute returns is retried within the lock: no other attempt takes
// the key over meanwhile, and it is recorded as soon as PostgreSQL is
// back. (Correctness does not depend on it: every recording write checks
// the attempt's token, so a write that comes after a takeover is refused,
// never recorded over the new owner's.) Half the AckWait (30 s by
// default), the bound before, gave up during a longer outage, and a
// webhook or an email that had succeeded was held unknown once the lock
// expired (TestRunRecordsAnOutcomeKnownDuringAPostgresOutage). Meanwhile
// the message may be delivered again: its attempt finds the key owned
// (busy) and waits, then finds the intent final.
func (r *Runtime) persistWindow() time.Duration {
	return r.store.Config().LockTimeout / 2
}

// unansweredBegins remembers, per intent, the nonce of a Begin whose
// answer was lost, until a Begin of the intent is answered or the key's
// lock has surely expired.
type unansweredBegins struct {
	mu sync.Mutex
	m  map[int64]unansweredBegin
}

type unansweredBegin struct {
	nonce int64
	until time.Time
}

// maxUnanswered bounds the intents remembered: past it the oldest are
// forgotten (their keys then wait for their locks to expire, as before).
const maxUnanswered = 10000

// options are the BeginOptions of the next Begin of intent id: a new
// nonce, and, after a lost answer, that Begin's nonce as Unanswered.
func (u *unansweredBegins) options(id int64) idempotency.BeginOptions {
	o := idempotency.BeginOptions{Nonce: rand.Int64N(1<<62) + 1}
	u.mu.Lock()
	defer u.mu.Unlock()
	if b, ok := u.m[id]; ok && time.Now().Before(b.until) {
		o.Unanswered = b.nonce
	}
	return o
}

// lost records that the Begin of intent id with nonce got no answer.
func (u *unansweredBegins) lost(id, nonce int64, lockTimeout time.Duration) {
	if lockTimeout <= 0 {
		lockTimeout = idempotency.DefaultLockTimeout
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[int64]unansweredBegin{}
	}
	now := time.Now()
	if len(u.m) >= maxUnanswered {
		for k, b := range u.m {
			if now.After(b.until) || len(u.m) >= maxUnanswered {
				delete(u.m, k)
			}
		}
	}
	u.m[id] = unansweredBegin{nonce: nonce, until: now.Add(lockTimeout)}
}

// answered forgets intent id: its Begin was answered.
func (u *unansweredBegins) answered(id int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.m, id)
}
