package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/fencemetrics"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/policy"
)

// Defaults of Config's fields.
const (
	DefaultNotifyWindow  = 5 * time.Millisecond
	DefaultGroupMaxBatch = 128
	DefaultGroupFlushers = 2
	DefaultGroupTimeout  = 30 * time.Second
	DefaultLockTimeout   = 5 * time.Second
)

// Config configures a Client.
type Config struct {
	// Schema is the PostgreSQL schema fencegate's tables live in (gateway
	// migrate --schema). Default: "fencegate".
	Schema string
	// MaxPayloadBytes limits a payload's size. Default: 256 KiB.
	MaxPayloadBytes int
	// Kinds are the intent kinds accepted, by name. Default (nil):
	// DefaultKinds(); an empty map is refused (it would refuse every intent).
	// Pass DefaultKinds() plus your own to add a kind.
	Kinds map[string]KindSpec
	// KeyScope confines idempotency keys. KeyScopeGlobal (the default): a
	// key is unique per kind across all resources, so any enqueuer can
	// claim any key. KeyScopeResource: the effective key is
	// "<bytes of the resource>:<resource>/<key>" ("13:reports/daily/k1"),
	// so an enqueuer can only collide with intents of
	// its own resource (see KeyScopeResource). Every client that enqueues
	// into one database should use the same scope.
	KeyScope KeyScope
	// Principal is who this client enqueues as, recorded on its intents
	// and, once a rule set is applied (package policy, gateway policy
	// apply), checked against it in each enqueue's transaction: a
	// resource or kind outside the principal's scope is refused with a
	// *fenceerr.ForbiddenError, nothing stored. WithPrincipal overrides it
	// per call. Empty: none; under a rule set every enqueue is then
	// refused (field principal).
	Principal string
	// DisableNotify turns off the NOTIFY that wakes dispatchers at commit;
	// dispatchers then find new intents by polling.
	DisableNotify bool
	// ListenPool is where Wait's one LISTEN connection comes from: a pool
	// on PostgreSQL itself when the client's pool goes through a
	// connection pooler in transaction mode (PgBouncer), where a LISTEN
	// outlives its transaction on a server connection other clients then
	// use, and never hears anything. Nil: the client's pool, unless
	// DisableListen. Not closed by the client.
	ListenPool *pgxpool.Pool
	// DisableListen makes Wait re-read its intent every second instead of
	// being woken by PostgreSQL's notification of outcomes (for a pool
	// through a pooler in transaction mode, without a ListenPool).
	// Ignored when ListenPool is set.
	DisableListen bool
	// NotifyWindow coalesces the NOTIFYs of Enqueue, EnqueueBatch and group
	// commits: at most one of their transactions per window carries a
	// NOTIFY, and when any was left without one, a standalone NOTIFY follows
	// within the window after its commit (see notifier). NOTIFY takes a
	// global lock at commit in PostgreSQL, so one per enqueue serialises
	// concurrent commits. EnqueueTx always notifies in the caller's
	// transaction: only the caller knows when that commits. Negative: a
	// NOTIFY in every transaction. Default: 5ms.
	NotifyWindow time.Duration
	// GroupCommit makes concurrent Enqueue calls of this Client share
	// transactions: each call is still fenced, deduplicated and answered on
	// its own (see group.go for what a shared failure means). It trades a
	// little latency under load for fewer commits. Default: off.
	GroupCommit bool
	// GroupMaxBatch bounds the intents of one shared transaction.
	// Default: 128.
	GroupMaxBatch int
	// GroupFlushers bounds the shared transactions in flight at once; while
	// they run, new calls queue up and go together into the next one.
	// Default: 2.
	GroupFlushers int
	// GroupTimeout bounds one shared transaction (it is detached from the
	// callers' contexts, which only stop their own wait). Default: 30s.
	GroupTimeout time.Duration
	// LockTimeout bounds how long the client's own transactions (Enqueue,
	// EnqueueBatch, group commits) wait for a lock the enqueue needs:
	// the resource's control row, which an open transaction holds while a
	// worker sits inside EnqueueTx for the same resource, and every lease
	// grant holds briefly. Past it the call fails with a *BusyError
	// (ErrBusy), nothing stored, instead of waiting as long as the other
	// transaction stays open. It is set for the enqueue's statement only
	// (PostgreSQL's lock_timeout, transaction-local), rounded up to whole
	// milliseconds. EnqueueTx and EnqueueBatchTx run in the caller's
	// transaction and keep its lock_timeout (SET LOCAL lock_timeout = '5s'
	// there; running into it is a *BusyError too). Default:
	// DefaultLockTimeout (5s, as a lease grant's); negative: no bound.
	LockTimeout time.Duration
	// Registerer receives the stale-epoch rejection counter. Nil: not
	// registered.
	Registerer prometheus.Registerer
	// Logger. Nil: discard.
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	c.KeyScope = cmp.Or(c.KeyScope, KeyScopeGlobal)
	c.NotifyWindow = cmp.Or(c.NotifyWindow, DefaultNotifyWindow)
	c.GroupMaxBatch = cmp.Or(c.GroupMaxBatch, DefaultGroupMaxBatch)
	c.GroupFlushers = cmp.Or(c.GroupFlushers, DefaultGroupFlushers)
	c.GroupTimeout = cmp.Or(c.GroupTimeout, DefaultGroupTimeout)
	c.LockTimeout = cmp.Or(c.LockTimeout, DefaultLockTimeout)
	if c.Kinds == nil {
		c.Kinds = DefaultKinds()
	} else {
		c.Kinds = maps.Clone(c.Kinds)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks c, its defaults applied, connecting to nothing. An error
// is a *ValidationError naming the field (GroupMaxBatch, Kinds, …).
func (c Config) Validate() error { return c.WithDefaults().validate() }

func (c Config) validate() error {
	switch {
	case c.GroupMaxBatch < 1:
		return invalidConfig("GroupMaxBatch", "must be at least 1, got %d", c.GroupMaxBatch)
	case c.GroupFlushers < 1:
		return invalidConfig("GroupFlushers", "must be at least 1, got %d", c.GroupFlushers)
	case c.GroupTimeout <= 0:
		return invalidConfig("GroupTimeout", "must be positive, got %s", c.GroupTimeout)
	case c.KeyScope != KeyScopeGlobal && c.KeyScope != KeyScopeResource:
		return invalidConfig("KeyScope", "must be %q or %q, got %q", KeyScopeGlobal, KeyScopeResource, c.KeyScope)
	case c.MaxPayloadBytes < 2:
		return invalidConfig("MaxPayloadBytes", "must be at least 2, got %d", c.MaxPayloadBytes)
	}
	if _, err := pgschema.Parse(c.Schema); err != nil {
		return invalidConfig("Schema", "%s", strings.TrimPrefix(err.Error(), "schema: "))
	}
	if len(c.Kinds) == 0 {
		// An empty map, not nil (nil is DefaultKinds()): a client that
		// would refuse every intent.
		return invalidConfig("Kinds", "holds no kind, so every intent would be refused; nil means DefaultKinds()")
	}
	for name, k := range c.Kinds {
		if err := ValidateKindName("Kinds", name); err != nil {
			return fmt.Errorf("outbox: %w", err)
		}
		if k.DefaultFence != FenceCommit && k.DefaultFence != FenceExecute {
			return invalidConfig("Kinds", "kind %q: default fence must be commit or execute", name)
		}
	}
	return nil
}

// invalidConfig is a bad Config field: a *ValidationError naming it.
func invalidConfig(field, format string, args ...any) error {
	return fmt.Errorf("outbox: %w", fenceerr.Invalid(field, format, args...))
}

// Client enqueues and looks up intents. It is safe for concurrent use.
type Client struct {
	pool   *pgxpool.Pool
	schema pgschema.Schema
	cfg    Config
	notify *notifier
	group  *grouper
	stale  prometheus.Counter
	// wait: the waiters of Wait and their listener, made on first use.
	waitOnce sync.Once
	wait     *waitSet
}

// countStale counts a stale-epoch rejection (metric
// fencegate_stale_epoch_rejections_total{where="enqueue"}).
func (c *Client) countStale(err error) {
	if err != nil && errors.Is(err, ErrStaleEpoch) {
		c.stale.Inc()
	}
}

// New returns a Client over pool, which must point at the primary. A bad
// cfg field is a *fenceerr.InvalidError naming it. pool may be nil for a
// client that only checks intents (Validate, Kinds), touching no
// database: `gateway enqueue` checks its input so before it connects.
func New(pool *pgxpool.Pool, cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Client{pool: pool, schema: pgschema.MustParse(cfg.Schema), cfg: cfg, stale: fencemetrics.StaleRejections(cfg.Registerer).WithLabelValues(fencemetrics.WhereEnqueue)}
	c.notify = newNotifier(pool, cfg)
	if cfg.GroupCommit {
		c.group = newGrouper(c)
	}
	return c, nil
}

// Schema returns the name of the PostgreSQL schema the client works in.
func (c *Client) Schema() string { return c.schema.Name() }

// principal is who an enqueue with ctx is made as: WithPrincipal's, else
// Config.Principal.
func (c *Client) principal(ctx context.Context) string {
	if p := principalOf(ctx); p != "" {
		return p
	}
	return c.cfg.Principal
}

// Kinds returns the names of the intent kinds the client accepts, sorted:
// the one list the intake and the pages show.
func (c *Client) Kinds() []string { return slices.Sorted(maps.Keys(c.cfg.Kinds)) }

// Validate checks an intent as Enqueue would, without touching the database,
// and returns it with defaults filled in.
func (c *Client) Validate(in Intent) (Intent, error) {
	return normalize(in, c.cfg.Kinds, c.cfg.MaxPayloadBytes, c.cfg.KeyScope)
}

// Enqueue commits the intent in its own transaction if in.Epoch is the
// resource's current epoch. See the package doc for the guarantee.
func (c *Client) Enqueue(ctx context.Context, in Intent) (Result, error) {
	in, err := c.Validate(in)
	if err != nil {
		return Result{}, err
	}
	ctx, span, tc := startEnqueueSpan(ctx, in)
	res, err := c.enqueueCommitted(ctx, in, tc)
	endEnqueueSpan(span, res, err)
	c.countStale(err)
	return res, err
}

// enqueueCommitted enqueues in its own transaction (or a shared group
// commit), storing the trace context tc with the intent.
func (c *Client) enqueueCommitted(ctx context.Context, in Intent, tc string) (Result, error) {
	if c.group != nil && c.principal(ctx) == c.cfg.Principal {
		// Group commit shares one transaction among callers with different
		// traces; the trace context is not stored on this path.
		return c.group.enqueue(ctx, in)
	}
	// A single statement runs as its own transaction: the function below
	// locks, checks and inserts inside it, so it commits or not as a whole.
	// So when it returns, it has committed: the notifier may follow up.
	notify := c.notify.claim()
	res, err := c.enqueueTraced(ctx, c.pool, in, notify, tc, true)
	if !notify && mayHaveInserted(res, err) {
		c.notify.suppressed()
	}
	return res, err
}

// EnqueueTx enqueues the intent inside the caller's transaction, so business
// data and the intent commit or roll back together. The resource's control
// row stays locked until tx ends: keep the transaction short. Every lease
// grant of the resource waits for that lock (at most the issuer's lock
// timeout, then lease.ErrBusy), so set idle_in_transaction_session_timeout
// on the pool's connections to bound a paused or stuck worker.
//
// Use READ COMMITTED (the default). Under REPEATABLE READ or SERIALIZABLE a
// concurrent takeover makes PostgreSQL abort with a serialization failure,
// which is safe but must be retried by the caller.
func (c *Client) EnqueueTx(ctx context.Context, tx pgx.Tx, in Intent) (Result, error) {
	in, err := c.Validate(in)
	if err != nil {
		return Result{}, err
	}
	ctx, span, tc := startEnqueueSpan(ctx, in)
	// Always notify here: the trailing NOTIFY of the coalescing notifier
	// could run before the caller commits, and then wake nobody in time.
	res, err := c.enqueueTraced(ctx, tx, in, !c.cfg.DisableNotify, tc, false)
	endEnqueueSpan(span, res, err)
	c.countStale(err)
	return res, err
}

type queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// enqueueArgs are the first eight parameters of every enqueue statement
// (statement.go), so a new parameter is added in these two places only.
func enqueueArgs(in Intent, notify bool) []any {
	return []any{in.Resource, in.Epoch, in.OperationID, in.Kind, in.IdempotencyKey, string(in.Fence), string(in.Payload), notify}
}

// enqueueTraced runs the fenced enqueue of a validated intent, storing the
// W3C trace context tc with it (nothing extra when tc is empty); notify
// says whether its transaction sends the NOTIFY, own that the statement is
// its own transaction (q is the pool), which takes the client's
// LockTimeout.
func (c *Client) enqueueTraced(ctx context.Context, q queryer, in Intent, notify bool, tc string, own bool) (Result, error) {
	args := enqueueArgs(in, notify)
	as := 0
	if p := c.principal(ctx); tc != "" || p != "" {
		as, args = 1, append(args, tc, p)
	}
	bounded, waited := c.lockBound(own)
	if bounded == 1 {
		args = append(args, lockTimeoutSetting(waited))
	}
	return c.run(ctx, q, in, enqueueStatements[as][bounded], args, waited)
}

// lockBound says whether a statement sets lock_timeout (1) and to what:
// the client's own transactions do, when LockTimeout is positive.
func (c *Client) lockBound(own bool) (int, time.Duration) {
	if own && c.cfg.LockTimeout > 0 {
		return 1, c.cfg.LockTimeout
	}
	return 0, 0
}

// busy is err as a *BusyError when the statement gave up waiting for a
// lock (SQLSTATE 55P03, lock_not_available: our lock_timeout, or the
// caller's inside EnqueueTx); resource is "" for a batch.
func busy(err error, resource string, waited time.Duration) (*BusyError, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		// The PostgreSQL error stays in the chain: a group commit retries
		// each call alone when the shared statement failed at the server
		// (isServerError).
		return &BusyError{Resource: resource, Waited: waited, cause: err}, true
	}
	return nil, false
}

func (c *Client) run(ctx context.Context, q queryer, in Intent, sql string, args []any, waited time.Duration) (Result, error) {
	var (
		outcome       string
		status        *string
		id            *int64
		current       int64
		existingEpoch *int64
	)
	err := q.QueryRow(ctx, c.schema.SQL(sql), args...).Scan(&outcome, &id, &status, &current, &existingEpoch)
	if err != nil {
		if f := policy.Refusal(err); f != err {
			return Result{}, f
		}
		if b, ok := busy(err, in.Resource, waited); ok {
			return Result{}, b
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
			// A data exception (class 22): PostgreSQL refused a value Go's
			// checks let through, e.g. a lone UTF-16 surrogate escape in the
			// payload. The statement failed, so nothing was stored.
			return Result{}, &ValidationError{Field: "payload", Message: "rejected by PostgreSQL: " + pgErr.Message}
		}
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			// Only reachable outside READ COMMITTED: another transaction
			// committed the same operation id after our snapshot.
			return Result{}, fmt.Errorf("outbox: enqueue: operation id %q committed concurrently; retry: %w", in.OperationID, err)
		}
		return Result{}, fmt.Errorf("outbox: enqueue: %w", err)
	}
	return outcomeResult(in, outcome, id, status, current)
}

// outcomeResult turns a row of fencegate_enqueue or fencegate_enqueue_batch
// into the caller's answer.
func outcomeResult(in Intent, outcome string, id *int64, status *string, current int64) (Result, error) {
	var intentID int64
	var st Status
	if id != nil {
		intentID = *id
	}
	if status != nil {
		st = Status(*status)
	}
	switch outcome {
	case "inserted":
		return Result{IntentID: intentID, Status: st}, nil
	case "duplicate":
		return Result{IntentID: intentID, Status: st, Duplicate: true}, nil
	case "conflict":
		return Result{}, &ConflictError{Resource: in.Resource, OperationID: in.OperationID, IntentID: intentID}
	case "stale":
		return Result{}, &StaleEpochError{Resource: in.Resource, Supplied: in.Epoch, Current: current}
	}
	return Result{}, fmt.Errorf("outbox: enqueue: unexpected outcome %q", outcome)
}

// mayHaveInserted reports whether an enqueue's answer leaves open that it
// committed a new intent: it did, or an error (a lost connection, a
// cancelled context) hides whether it did.
func mayHaveInserted(res Result, err error) bool {
	if err == nil {
		return !res.Duplicate
	}
	return !errors.Is(err, ErrStaleEpoch) && !errors.Is(err, ErrOperationConflict) && !errors.Is(err, ErrInvalid)
}

const recordColumns = `intent_id, resource_id, epoch, operation_id, kind, idempotency_key, fence,
	payload, status, attempts, result, last_error, created_at, updated_at, relayed_at, completed_at, trace_context,
	coalesce(principal, ''), effect, not_before`

func scanRecord(row pgx.Row) (*Record, error) {
	var r Record
	var fence, status, effect string
	var payload, result, traceCtx []byte
	err := row.Scan(&r.IntentID, &r.Resource, &r.Epoch, &r.OperationID, &r.Kind, &r.IdempotencyKey, &fence,
		&payload, &status, &r.Attempts, &result, &r.LastError, &r.CreatedAt, &r.UpdatedAt, &r.RelayedAt, &r.CompletedAt, &traceCtx, &r.Principal,
		&effect, &r.NotBefore)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	r.Fence, r.Status, r.Payload, r.TraceContext, r.Effect = Fence(fence), Status(status), payload, traceCtx, Effect(effect)
	if result != nil {
		r.Result = result
	}
	return &r, nil
}

// Get returns the intent with the given id, or ErrNotFound.
func (c *Client) Get(ctx context.Context, intentID int64) (*Record, error) {
	r, err := scanRecord(c.pool.QueryRow(ctx, c.schema.SQL(`SELECT `+recordColumns+` FROM fencegate.intents WHERE intent_id = $1`), intentID))
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("outbox: get intent %d: %w", intentID, err)
	}
	return r, err
}

// GetMany returns the intents with the given ids that exist, by id, in one
// statement (a read: what the adapters' runtime loads for a batch of
// messages).
func (c *Client) GetMany(ctx context.Context, ids []int64) (map[int64]*Record, error) {
	rows, err := c.pool.Query(ctx, c.schema.SQL(`SELECT `+recordColumns+` FROM fencegate.intents WHERE intent_id = ANY($1)`), ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: get %d intents: %w", len(ids), err)
	}
	defer rows.Close()
	out := make(map[int64]*Record, len(ids))
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("outbox: get %d intents: %w", len(ids), err)
		}
		out[r.IntentID] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: get %d intents: %w", len(ids), err)
	}
	return out, nil
}

// Lookup returns the intent a resource's operation id committed, or
// ErrNotFound.
func (c *Client) Lookup(ctx context.Context, resource, operationID string) (*Record, error) {
	r, err := scanRecord(c.pool.QueryRow(ctx, c.schema.SQL(`SELECT `+recordColumns+` FROM fencegate.intents WHERE resource_id = $1 AND operation_id = $2`), resource, operationID))
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("outbox: lookup %q/%q: %w", resource, operationID, err)
	}
	return r, err
}
