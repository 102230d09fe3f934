package idempotency

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/internal/durable"
	"github.com/fencegate/fencegate/internal/group"
	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/outbox"
)

// Defaults of Config's fields.
const (
	DefaultLockTimeout   = 5 * time.Minute
	DefaultRetention     = 30 * 24 * time.Hour
	DefaultSweepInterval = 10 * time.Minute
	DefaultSweepBatch    = 1000
)

// Limits on arguments, in bytes. MaxKeyLen matches the intents table's
// idempotency_key limit.
const (
	MaxKindLen        = 64
	MaxKeyLen         = 255
	MaxFingerprintLen = 128
)

// Config configures a Store.
type Config struct {
	// Schema is the PostgreSQL schema fencegate's tables live in (gateway
	// migrate --schema). Default: "fencegate".
	Schema string
	// LockTimeout is how long an attempt owns a key after Begin (or Extend):
	// a started attempt older than this without completion counts as
	// abandoned and the next Begin answers Recover. It must exceed the
	// longest execution of an effect. Default: 5 minutes.
	LockTimeout time.Duration
	// Retention is how long a completed key is kept, from its completion,
	// before Sweep deletes it. Default: 30 days.
	Retention time.Duration
	// SweepInterval is how often a Sweeper sweeps. Default: 10 minutes.
	SweepInterval time.Duration
	// SweepBatch is how many keys one sweep statement deletes at most, so
	// no sweep holds many row locks for long. Default: 1000.
	SweepBatch int
	// Logger receives the sweeper's reports and takeovers of abandoned
	// attempts. Nil: discard.
	Logger *slog.Logger
	// GroupCommit makes the BeginRecording and CompleteOutcome calls of
	// concurrent attempts share durable transactions (see group.go): the
	// same answers and guarantees, one commit per batch. Begin, Complete
	// and the other calls always run alone.
	GroupCommit bool
	// GroupMaxBatch bounds the calls of one shared transaction. Default
	// DefaultGroupMaxBatch.
	GroupMaxBatch int
	// GroupFlushers bounds the shared transactions of each kind (Begins,
	// Completes) running at once; while one runs, a further one starts
	// only once GroupMaxBatch calls wait. Default DefaultGroupFlushers.
	GroupFlushers int
	// Registerer receives the group commit's metrics
	// (fencegate_idempotency_group_*). Nil: none registered.
	Registerer prometheus.Registerer
}

// Group commit defaults.
const (
	DefaultGroupMaxBatch = 128
	DefaultGroupFlushers = 4
)

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.LockTimeout = cmp.Or(c.LockTimeout, DefaultLockTimeout)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.SweepInterval = cmp.Or(c.SweepInterval, DefaultSweepInterval)
	c.SweepBatch = cmp.Or(c.SweepBatch, DefaultSweepBatch)
	c.GroupMaxBatch = cmp.Or(c.GroupMaxBatch, DefaultGroupMaxBatch)
	c.GroupFlushers = cmp.Or(c.GroupFlushers, DefaultGroupFlushers)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks c, its defaults applied, connecting to nothing. An error
// is a *fenceerr.InvalidError (InvalidError) naming the field
// (LockTimeout, Retention, …).
func (c Config) Validate() error { return c.WithDefaults().validate() }

func (c Config) validate() error {
	switch {
	case c.LockTimeout < time.Millisecond || c.LockTimeout > 24*time.Hour:
		return invalid("LockTimeout", "must be between 1ms and 24h")
	case c.Retention < time.Second:
		return invalid("Retention", "must be at least 1s, got %s", c.Retention)
	case c.SweepInterval < time.Millisecond:
		return invalid("SweepInterval", "must be at least 1ms, got %s", c.SweepInterval)
	case c.SweepBatch < 1 || c.SweepBatch > 100_000:
		return invalid("SweepBatch", "must be between 1 and 100000, got %d", c.SweepBatch)
	case c.GroupMaxBatch < 1 || c.GroupMaxBatch > 10_000:
		return invalid("GroupMaxBatch", "must be between 1 and 10000, got %d", c.GroupMaxBatch)
	case c.GroupFlushers < 1 || c.GroupFlushers > 64:
		return invalid("GroupFlushers", "must be between 1 and 64, got %d", c.GroupFlushers)
	}
	if err := pgschema.Check(cmp.Or(c.Schema, pgschema.Default)); err != nil {
		return invalid("Schema", "%s", strings.TrimPrefix(err.Error(), "schema: "))
	}
	return nil
}

// Store is the idempotency key store. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	cfg  Config
	// schema qualifies the statements; intents is the schema's intents
	// table (internal/intents).
	schema  pgschema.Schema
	intents intents.Table
	// begins and completes are the group commit batchers (nil without
	// Config.GroupCommit).
	begins    *group.Batcher[beginCall, Decision]
	completes *group.Batcher[Completion, CompleteResult]
	// groupFailures counts failed shared transactions (GroupFailures).
	groupFailures atomic.Int64
	// batchSize and failures are the group commit's metrics, by op
	// (begin, complete).
	batchSize *prometheus.HistogramVec
	failures  *prometheus.CounterVec
}

// New returns a Store over pool, which must point at the primary: ownership
// of a key is never decided on a replica that may lag.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, invalid("pool", "must not be nil")
	}
	schema := pgschema.MustParse(cfg.Schema)
	s := &Store{pool: pool, cfg: cfg, schema: schema, intents: intents.In(schema),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fencegate_idempotency_group_batch_size",
			Help:    "Calls decided in one shared transaction (group commit), by op: begin, complete.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128},
		}, []string{"op"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencegate_idempotency_group_failures_total",
			Help: "Shared transactions (group commit) that failed — a deadlock, any server error — whose calls then ran alone, by op.",
		}, []string{"op"}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.batchSize, s.failures} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("idempotency: register metrics: %w", err)
			}
		}
	}
	// Every op's failure count from 0: one that appeared at its first
	// failure would read 1 in its first sample, and increase() would not
	// see that failure.
	for _, op := range []string{"begin", "complete"} {
		s.failures.WithLabelValues(op)
	}
	if cfg.GroupCommit {
		// A further shared transaction starts only once a whole batch
		// (GroupMaxBatch calls) waits for one: while one runs, the calls
		// that arrive wait and leave together in the next, so under load
		// the batches grow rather than the transactions multiplying, and
		// the other flushers add parallelism only where one transaction at
		// a time cannot keep up. Measured (gateway bench, e2e-drain on 2
		// cores, docs/performance.md): starting one more at 16 waiting
		// calls cost 0.67-0.72 statements and 0.39-0.41 round trips per
		// settled intent; at a whole batch, 0.30-0.32 and 0.18-0.20, and
		// the drain ran 1-28 % faster. At a low rate nothing changes: one
		// transaction runs at a time either way.
		gc := group.Config{MaxBatch: cfg.GroupMaxBatch, Flushers: cfg.GroupFlushers, Backlog: cfg.GroupMaxBatch}
		s.begins = group.New(gc, s.beginBatch)
		s.completes = group.New(gc, s.completeBatch)
	}
	return s, nil
}

// Config returns the store's configuration, defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Outcome is Begin's answer.
type Outcome string

// Begin's outcomes. Exactly one is returned.
const (
	// OutcomeExecute: the key was new; this attempt owns it and may perform
	// the effect.
	OutcomeExecute Outcome = "execute"
	// OutcomeDone: the effect was completed before with the same
	// fingerprint; the Decision carries its Status, Result and the intent
	// that completed it. Do not execute.
	OutcomeDone Outcome = "done"
	// OutcomeBusy: another attempt owns the key and its lock is fresh, or
	// the key is held with an unknown outcome. Do not execute.
	OutcomeBusy Outcome = "busy"
	// OutcomeRecover: an earlier attempt started and was abandoned (its lock
	// expired). This attempt now owns the key with a new token and must
	// look the outcome up at the destination before doing anything.
	OutcomeRecover Outcome = "recover"
	// OutcomeConflict: the key is used for a different fingerprint. Never
	// execute.
	OutcomeConflict Outcome = "conflict"
)

// State is a key's state.
type State string

// Key states.
const (
	// StateStarted: an attempt owns the key until LockedUntil.
	StateStarted State = "started"
	// StateCompleted: the outcome (succeeded or failed) is recorded.
	StateCompleted State = "completed"
	// StateHeld: the outcome is unknown; nothing is started automatically
	// until an operator calls Unhold.
	StateHeld State = "held"
)

// Decision is Begin's answer.
type Decision struct {
	// Outcome says what the caller may do.
	Outcome Outcome
	// Token is the attempt token (Execute, Recover) to pass to Complete,
	// Release and Extend. It is unique across all keys and never reused.
	Token int64
	// Result is the recorded result (Done; Busy on a held key: what the
	// attempt with the unknown outcome recorded, if anything).
	Result json.RawMessage
	// Status is the recorded final status (Done: succeeded or failed; Busy
	// on a held key: unknown).
	Status outbox.Status
	// OwnerIntentID is the intent whose attempt owns the key (Execute,
	// Recover: intentID; Busy: the other attempt's, or the one whose
	// outcome is unknown), completed it (Done), or holds the existing
	// fingerprint (Conflict).
	OwnerIntentID int64
	// LockedUntil is when the owning attempt's lock expires, by
	// PostgreSQL's clock (Execute, Recover: this attempt's; Busy: the
	// other's; zero on a held key). Don't compare it with a local clock;
	// use RetryAfter.
	LockedUntil time.Time
	// RetryAfter is, for Busy, how long until the other attempt's lock
	// expires, as measured by PostgreSQL; zero on a held key.
	RetryAfter time.Duration
	// Held is true for Busy on a key held with an unknown outcome: retrying
	// does not help until an operator calls Unhold.
	Held bool
	// Attempts is the intent's attempt count after this Begin (Execute,
	// Recover; from 1); zero for the other outcomes, which count no
	// attempt.
	Attempts int
	// CountedAt is when Begin counted this attempt, on the caller's clock:
	// the attempt's start for its history (Attempt.Elapsed). Zero when
	// Begin counted none (Done, Conflict, Busy, a resumed Recover).
	CountedAt time.Time
	// LastIOAt (Recover) bounds the I/O of every earlier attempt under the
	// key with the destination, by PostgreSQL's clock: a lookup that finds
	// nothing is proof only once the destination's settle window has
	// passed since then (see AwaitProof).
	LastIOAt *time.Time
	// Effect (Execute, Recover) is the intent's effect after this Begin:
	// possible when an earlier attempt's outcome is unknown or, on a
	// takeover, the abandoned attempt may have performed it (Begin marks
	// it so in the same transaction). Where it is possible, an attempt
	// that fails must neither release the key nor end the intent failed.
	Effect outbox.Effect
	// Resumed (Recover) says this intent was itself the owner, waiting for
	// proof with a fresh lock: the redelivery took the key back with a new
	// token, without counting an attempt.
	Resumed bool
	// IntentRecorded (BeginRecording: Done, Conflict, Busy on a held key)
	// says the intent's final status was recorded in Begin's transaction;
	// false when the intent already had one (which stays, and the outcome
	// that was not recorded is in the intent's history).
	IntentRecorded bool
}

// Key is a key's row, for tests and operators.
type Key struct {
	Kind          string          `json:"kind"`
	Key           string          `json:"key"`
	Fingerprint   string          `json:"fingerprint"`
	State         State           `json:"state"`
	Token         int64           `json:"token"`
	OwnerIntentID int64           `json:"owner_intent_id"`
	FirstIntentID int64           `json:"first_intent_id"`
	LockedUntil   *time.Time      `json:"locked_until"`
	Status        outbox.Status   `json:"status,omitempty"`
	Result        json.RawMessage `json:"result"`
	LastError     *string         `json:"last_error"`
	// Attempts counts the ownerships of the key (Execute and Recover).
	Attempts int `json:"attempts"`
	// LastIOAt bounds the I/O with the destination of the attempts under
	// the key; nil while the owner may be doing I/O (see AwaitProof).
	LastIOAt    *time.Time `json:"last_io_at"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	CompletedAt *time.Time `json:"completed_at"`
}

// terminalStatuses are the intent statuses after which nothing changes an
// intent automatically; derived from outbox so the two never disagree.
var terminalStatuses = func() []string {
	var out []string
	for _, s := range []outbox.Status{
		outbox.StatusPending, outbox.StatusRelayed, outbox.StatusSucceeded, outbox.StatusFailed,
		outbox.StatusSuperseded, outbox.StatusUnknown, outbox.StatusCancelled,
	} {
		if s.Terminal() {
			out = append(out, string(s))
		}
	}
	return out
}()

func interval(d time.Duration) string { return fmt.Sprintf("%d microseconds", d.Microseconds()) }

func checkName(field, v string, max int) error {
	switch {
	case v == "":
		return invalid(field, "must not be empty")
	case len(v) > max:
		return invalid(field, "must be at most %d bytes, got %d", max, len(v))
	}
	return nil
}

func checkKey(kind, key string) error {
	if err := checkName("kind", kind, MaxKindLen); err != nil {
		return err
	}
	return checkName("key", key, MaxKeyLen)
}

func checkResult(r json.RawMessage) error {
	if len(r) > 0 && !validJSON(r) {
		return invalid("result", "must be valid JSON")
	}
	return nil
}

// inTx runs fn in a READ COMMITTED transaction and commits it. The rollback
// is deferred with a context that is not cancelled, so a cancelled ctx never
// leaves a transaction open on a pooled connection.
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return s.inTxWith(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
}

// inTxWith is inTx with its own transaction options (group commit's).
func (s *Store) inTxWith(ctx context.Context, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	// durable: an attempt's ownership and an outcome recorded before the
	// message is acked must survive a crash (see internal/durable).
	return durable.InTx(ctx, s.pool, opts, fn)
}

// Begin decides, in one transaction, whether the attempt of intent intentID
// to perform the effect with the given fingerprint under (kind, key) may go
// ahead. See Outcome for the five answers. Execute and Recover also count an
// attempt on the intent (intents.attempts) in the same transaction; for an
// intent that already has a final status (e.g. cancelled) they are refused
// with an *IntentTerminalError and nothing is written, so an operator's
// cancel and an attempt's start are ordered by the intent's row lock.
func (s *Store) Begin(ctx context.Context, kind, key, fingerprint string, intentID int64) (Decision, error) {
	if err := checkBegin(kind, key, fingerprint, intentID); err != nil {
		return Decision{}, err
	}
	return s.beginAndRecord(ctx, kind, key, fingerprint, intentID, false, BeginOptions{})
}

// checkBegin checks the arguments of Begin and BeginRecording.
func checkBegin(kind, key, fingerprint string, intentID int64) error {
	if err := checkKey(kind, key); err != nil {
		return err
	}
	if err := checkName("fingerprint", fingerprint, MaxFingerprintLen); err != nil {
		return err
	}
	if intentID < 1 {
		return invalid("intent_id", "must be at least 1, got %d", intentID)
	}
	return nil
}

func (s *Store) beginAndRecord(ctx context.Context, kind, key, fingerprint string, intentID int64, record bool, o BeginOptions) (Decision, error) {
	var d Decision
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		d, err = s.begin(ctx, tx, kind, key, fingerprint, intentID, o)
		if err != nil || !record {
			return err
		}
		return s.recordUnexecuted(ctx, tx, key, &d, intentID)
	})
	if err != nil {
		var ie *IntentTerminalError
		if errors.As(err, &ie) || errors.Is(err, ErrIntentNotFound) {
			return Decision{}, err
		}
		// Deferred: nothing was written (the transaction rolled back);
		// come back when the deferral is over.
		var de *DeferredError
		if errors.As(err, &de) {
			return Decision{Outcome: OutcomeBusy, OwnerIntentID: intentID, RetryAfter: de.Remaining}, nil
		}
		return Decision{}, fmt.Errorf("idempotency: begin %s/%q: %w", kind, key, err)
	}
	if d.Outcome == OutcomeRecover && !d.Resumed {
		s.cfg.Logger.Warn("idempotency: taking over an abandoned attempt",
			"kind", kind, "key", key, "intent_id", intentID, "token", d.Token)
	}
	return d, nil
}

func (s *Store) begin(ctx context.Context, tx pgx.Tx, kind, key, fingerprint string, intentID int64, o BeginOptions) (Decision, error) {
	lock := interval(s.cfg.LockTimeout)
	// The loop runs more than once only when the key's row disappears
	// between the two statements (Release or Sweep deleted it): then the
	// INSERT is tried again. Under READ COMMITTED each statement sees what
	// committed before it started, so the retry sees the deletion.
	for range 10 {
		// 1. Try to create the key. The primary key is the arbiter: of
		//    concurrent Begins of a new key exactly one inserts; the others
		//    wait for its transaction and, once it commits, do nothing.
		//    Reading first ("SELECT … FOR UPDATE; if absent, INSERT") would
		//    not work: a row that does not exist cannot be locked, so two
		//    attempts could both see no row and both decide to execute.
		//    clock_timestamp(), not now(): now() is the transaction's start
		//    and would shorten the lock by however long we waited.
		var d Decision
		err := tx.QueryRow(ctx, s.schema.SQL(`
			INSERT INTO fencegate.idempotency_keys
				(kind, idempotency_key, fingerprint, state, owner_intent_id, first_intent_id, locked_until, begin_nonce)
			VALUES ($1, $2, $3, 'started', $4, $4, clock_timestamp() + $5::interval, nullif($6::bigint, 0))
			ON CONFLICT (kind, idempotency_key) DO NOTHING
			RETURNING token, locked_until`),
			kind, key, fingerprint, intentID, lock, o.Nonce).Scan(&d.Token, &d.LockedUntil)
		if err == nil {
			d.Outcome, d.OwnerIntentID = OutcomeExecute, intentID
			// Counted in the same transaction as the key: if the intent
			// cannot take an attempt, the key is not created either.
			d.Attempts, d.Effect, err = s.countAttempt(ctx, tx, intentID, false)
			d.CountedAt = time.Now()
			return d, err
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Decision{}, fmt.Errorf("insert key: %w", err)
		}

		// 2. The key exists (committed: ON CONFLICT waited for its
		//    inserter). Lock its row: every decision below is taken on the
		//    row as it is while we hold the lock, and any takeover we write
		//    is the only one — a concurrent Begin waits here and then sees
		//    our new token and fresh lock, so two attempts never both
		//    Recover the same abandoned attempt.
		//    "fresh" is computed by PostgreSQL's clock when the row is read.
		//    If we waited for the lock and the row was updated meanwhile,
		//    PostgreSQL re-reads it and recomputes; if it was only locked,
		//    the clock value may be a little old, which can only make an
		//    expired lock look fresh (Busy: retry later), never the reverse.
		var (
			fp, state           string
			token, owner        int64
			lockedUntil         *time.Time
			status              *string
			result              []byte
			fresh               *bool
			retryAfterMicrosecs *int64
			lastIO              *time.Time
			nonce               *int64
		)
		err = tx.QueryRow(ctx, s.schema.SQL(`
			SELECT fingerprint, state, token, owner_intent_id, locked_until, status, result,
			       locked_until > clock_timestamp(),
			       (extract(epoch FROM greatest(locked_until - clock_timestamp(), interval '0')) * 1000000)::bigint,
			       last_io_at, begin_nonce
			FROM fencegate.idempotency_keys
			WHERE kind = $1 AND idempotency_key = $2
			FOR UPDATE`),
			kind, key).Scan(&fp, &state, &token, &owner, &lockedUntil, &status, &result, &fresh, &retryAfterMicrosecs, &lastIO, &nonce)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // deleted since step 1: try to create it again
		}
		if err != nil {
			return Decision{}, fmt.Errorf("lock key: %w", err)
		}

		// 3. Decide. The fingerprint comes first: whatever the key's state,
		//    different content under the same key is never executed, and
		//    never takes over someone else's attempt.
		if fp != fingerprint {
			return Decision{Outcome: OutcomeConflict, OwnerIntentID: owner}, nil
		}
		switch State(state) {
		case StateCompleted:
			d = Decision{Outcome: OutcomeDone, OwnerIntentID: owner, Result: result}
			if status != nil {
				d.Status = outbox.Status(*status)
			}
			return d, nil
		case StateHeld:
			// The outcome of an attempt is unknown. Re-executing could
			// perform the effect twice and taking over would only lead to
			// the same unknown, so the key waits for an operator (Unhold).
			return Decision{Outcome: OutcomeBusy, Held: true, Status: outbox.StatusUnknown, OwnerIntentID: owner, Result: result}, nil
		case StateStarted:
			if fresh != nil && *fresh && owner == intentID && lastIO != nil {
				// The owner is this very intent, waiting for proof: its
				// I/O is over (last_io_at set) and it only looks up,
				// between redeliveries of its message, keeping the lock
				// fresh so that no other intent takes the key over. This
				// is such a redelivery: resume with a new token (a
				// handler of an older delivery that is still running
				// can then no longer act), the lock and last_io_at as
				// they are, and no attempt counted — nothing is executed
				// until a lookup is proof.
				d = Decision{Outcome: OutcomeRecover, OwnerIntentID: intentID, Resumed: true}
				err = tx.QueryRow(ctx, s.schema.SQL(`
					UPDATE fencegate.idempotency_keys
					SET token = nextval('fencegate.idempotency_token_seq'), updated_at = now()
					WHERE kind = $1 AND idempotency_key = $2
					RETURNING token, locked_until, last_io_at`),
					kind, key).Scan(&d.Token, &d.LockedUntil, &d.LastIOAt)
				if err != nil {
					return Decision{}, fmt.Errorf("resume key: %w", err)
				}
				d.Attempts, d.Effect, err = s.currentAttempts(ctx, tx, intentID)
				return d, err
			}
			if fresh != nil && *fresh && owner == intentID && lastIO == nil &&
				o.Unanswered != 0 && nonce != nil && *nonce == o.Unanswered {
				// The caller's own Begin whose answer it lost: it never
				// had that decision, so nothing was executed under it
				// (no I/O declared either), and no other attempt can
				// hold this nonce. Take the key back as new: a new token
				// (should that Begin's answer still arrive somewhere, its
				// token no longer matches), a fresh lock, and this
				// Begin's nonce, so that the lost one takes the key back
				// once only (a second delivery of the intent holding it
				// finds the key Busy); its attempt was counted with the
				// key.
				d = Decision{Outcome: OutcomeExecute, OwnerIntentID: intentID}
				err = tx.QueryRow(ctx, s.schema.SQL(`
					UPDATE fencegate.idempotency_keys
					SET token = nextval('fencegate.idempotency_token_seq'),
					    locked_until = clock_timestamp() + $3::interval, begin_nonce = nullif($4::bigint, 0), updated_at = now()
					WHERE kind = $1 AND idempotency_key = $2
					RETURNING token, locked_until`),
					kind, key, lock, o.Nonce).Scan(&d.Token, &d.LockedUntil)
				if err != nil {
					return Decision{}, fmt.Errorf("take back key: %w", err)
				}
				// The lost Begin's attempt, run now: its row in the
				// attempt history is written when it ends.
				d.Attempts, d.Effect, err = s.currentAttempts(ctx, tx, intentID)
				d.CountedAt = time.Now()
				return d, err
			}
			if fresh != nil && *fresh {
				d = Decision{Outcome: OutcomeBusy, OwnerIntentID: owner, LockedUntil: *lockedUntil}
				if retryAfterMicrosecs != nil {
					d.RetryAfter = time.Duration(*retryAfterMicrosecs) * time.Microsecond
				}
				return d, nil
			}
			// The owner's lock expired: the attempt is abandoned. Take
			// over with a new token, so the abandoned attempt's Complete
			// and Release no longer match and it cannot overwrite what
			// this attempt finds out.
			//
			// last_io_at: when NULL the abandoned attempt may have been
			// doing I/O with the destination until this very moment (a
			// paused process does not notice its lock expired), and it
			// cannot do any later (its owner check before the
			// irrevocable step fails once the token is replaced) — so
			// the takeover time is the conservative bound. It is later
			// than the lock's expiry, never earlier. When set, the
			// previous owner had declared its I/O over: keep it.
			d = Decision{Outcome: OutcomeRecover, OwnerIntentID: intentID}
			// The abandoned attempt's row first: it is its intent's latest
			// attempt only until countAttempt below counts this one.
			if err := s.recordAbandoned(ctx, tx, owner, token, intentID); err != nil {
				return Decision{}, err
			}
			err = tx.QueryRow(ctx, s.schema.SQL(`
				UPDATE fencegate.idempotency_keys
				SET token = nextval('fencegate.idempotency_token_seq'), owner_intent_id = $3,
				    locked_until = clock_timestamp() + $4::interval,
				    last_io_at = coalesce(last_io_at, clock_timestamp()),
				    attempts = attempts + 1, updated_at = now()
				WHERE kind = $1 AND idempotency_key = $2
				RETURNING token, locked_until, last_io_at`),
				kind, key, intentID, lock).Scan(&d.Token, &d.LockedUntil, &d.LastIOAt)
			if err != nil {
				return Decision{}, fmt.Errorf("take over key: %w", err)
			}
			// The abandoned attempt may have performed the effect: the
			// intent's effect is possible from now on, marked in the
			// takeover's own transaction.
			d.Attempts, d.Effect, err = s.countAttempt(ctx, tx, intentID, true)
			d.CountedAt = time.Now()
			return d, err
		}
		return Decision{}, fmt.Errorf("key in unexpected state %q", state)
	}
	return Decision{}, errors.New("key keeps disappearing; giving up")
}

// currentAttempts returns the intent's attempts without counting one, only
// while the intent has no final status; the row lock orders it with an
// operator's cancel as countAttempt's UPDATE does.
func (s *Store) currentAttempts(ctx context.Context, tx pgx.Tx, intentID int64) (int, outbox.Effect, error) {
	l, ok, err := s.intents.Lock(ctx, tx, intentID)
	if err != nil {
		return 0, "", fmt.Errorf("read attempts of intent %d: %w", intentID, err)
	}
	if !ok {
		return 0, "", fmt.Errorf("%w: %d", ErrIntentNotFound, intentID)
	}
	if outbox.Status(l.Status).Terminal() {
		return 0, "", &IntentTerminalError{IntentID: intentID, Status: outbox.Status(l.Status)}
	}
	return l.Attempts, outbox.Effect(l.Effect), nil
}

// countAttempt increments the intent's attempts, only while the intent has
// no final status. The UPDATE locks the intent's row, so it is ordered with
// an operator's cancel: either the cancel committed first and we refuse, or
// it waits for our transaction and then sees the attempt
// (internal/intents.CountAttempt). possible marks the intent's effect
// possible in the same statement; it returns the attempts and the effect.
func (s *Store) countAttempt(ctx context.Context, tx pgx.Tx, intentID int64, possible bool) (int, outbox.Effect, error) {
	attempts, effect, ok, err := s.intents.CountAttempt(ctx, tx, intentID, terminalStatuses, possible)
	if err == nil && !ok {
		return 0, "", s.notCounted(ctx, tx, intentID)
	}
	if err != nil {
		return 0, "", fmt.Errorf("count attempt of intent %d: %w", intentID, err)
	}
	return attempts, outbox.Effect(effect), nil
}

// notCounted says why an attempt of intentID was not counted: its final
// status (*IntentTerminalError), its deferral (*DeferredError: its
// not_before is ahead), or ErrIntentNotFound.
func (s *Store) notCounted(ctx context.Context, tx pgx.Tx, intentID int64) error {
	var (
		status    string
		remaining int64 // microseconds
	)
	err := tx.QueryRow(ctx, s.schema.SQL(`
		SELECT status, coalesce((extract(epoch FROM greatest(not_before - clock_timestamp(), interval '0')) * 1000000)::bigint, 0)
		FROM fencegate.intents WHERE intent_id = $1`), intentID).Scan(&status, &remaining)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %d", ErrIntentNotFound, intentID)
	}
	if err != nil {
		return fmt.Errorf("read intent %d: %w", intentID, err)
	}
	if slices.Contains(terminalStatuses, status) {
		return &IntentTerminalError{IntentID: intentID, Status: outbox.Status(status)}
	}
	// Not final: deferred (a deferral that ended since the count is
	// answered alike, with no wait).
	return &DeferredError{IntentID: intentID, Remaining: time.Duration(remaining) * time.Microsecond}
}

func (s *Store) intentStatus(ctx context.Context, tx pgx.Tx, intentID int64) (outbox.Status, error) {
	var status string
	err := tx.QueryRow(ctx, s.schema.SQL(`SELECT status FROM fencegate.intents WHERE intent_id = $1`), intentID).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: %d", ErrIntentNotFound, intentID)
	}
	if err != nil {
		return "", fmt.Errorf("read intent %d: %w", intentID, err)
	}
	return outbox.Status(status), nil
}

// completeIntent sets the intent's outcome only while it has no final
// status, and reports whether it did. A final status is never overwritten:
// an operator's cancel, or the outcome another path recorded first, stays.
func (s *Store) completeIntent(ctx context.Context, tx pgx.Tx, intentID int64, status outbox.Status, result json.RawMessage, errMsg string, proven bool) (bool, error) {
	updated, err := s.intents.Complete(ctx, tx, intentID, string(status), result, errMsg, terminalStatuses, proven)
	if err != nil {
		return false, fmt.Errorf("record outcome of intent %d: %w", intentID, err)
	}
	if updated {
		return true, nil
	}
	current, err := s.intentStatus(ctx, tx, intentID)
	if err != nil {
		return false, err // ErrIntentNotFound: the caller rolls back
	}
	// Never dropped silently: what happened at the destination (or what
	// this path found out) goes into the intent's history, in the same
	// transaction as whatever else the caller records.
	note := fmt.Sprintf("outcome %s not recorded: the intent was already %s", status, current)
	if len(result) > 0 {
		note += "; result " + string(result)
	}
	if errMsg != "" {
		note += "; error: " + errMsg
	}
	if err := s.insertEvent(ctx, tx, intentID, EventOutcomeNotRecorded, note); err != nil {
		return false, err
	}
	return false, nil
}

func checkOutcomeStatus(status outbox.Status) error {
	switch status {
	case outbox.StatusSucceeded, outbox.StatusFailed, outbox.StatusUnknown, outbox.StatusSuperseded:
		return nil
	}
	return invalid("status", "must be succeeded, failed, unknown or superseded, got %q", status)
}

// Completion is the outcome of an attempt that owns a key.
type Completion struct {
	Kind string
	Key  string
	// Token is the attempt token Begin returned (Execute or Recover).
	Token int64
	// IntentID is the intent whose attempt it is (the one passed to Begin).
	IntentID int64
	// Status is the outcome:
	//   - succeeded: the effect happened. The key is completed; later
	//     Begins with the same fingerprint answer Done.
	//   - failed: the effect did not happen and never will with this
	//     content (a permanent error). The key is completed; later Begins
	//     answer Done with status failed.
	//   - unknown: the effect may or may not have happened and the
	//     destination cannot tell. The key is held: Begin answers Busy with
	//     Held set, and nothing is started automatically again until an
	//     operator calls Unhold.
	//   - superseded: the destination fenced the intent out (its epoch is
	//     older than one already applied); the effect did not happen. The
	//     key is released (deleted), so an intent with a current epoch and
	//     the same key is judged on its own.
	Status outbox.Status
	// Result is a JSON value describing the effect (message id, path, …);
	// optional.
	Result json.RawMessage
	// Error is the error message recorded as the intent's last_error (and
	// the key's); optional.
	Error string
	// Proven: a lookup after the settle window proved that no attempt
	// under the key performed the effect; the intent's effect, if marked
	// possible, becomes none.
	Proven bool
	// Attempt, when set, is recorded in the intent's attempt history in the
	// same transaction.
	Attempt *Attempt
}

// Complete records an attempt's outcome under its key and on its intent, in
// one transaction, only while the attempt still owns the key (c.Token is the
// key's current token and the key is started). An attempt that lost
// ownership (taken over after its lock expired, released, swept) gets an
// *OwnershipError (errors.Is ErrLostOwnership) and nothing is written.
//
// The intent's status, result, last_error and completed_at are set only
// while the intent has no final status; intentUpdated reports whether they
// were. When it is false (an operator cancelled the intent meanwhile, or a
// retry of this Complete found its first call committed) the key's outcome
// is still recorded: the key records what happened at the destination, so
// the effect is not repeated whatever became of the intent. When the intent
// already had a final status, the outcome that could not be recorded on it
// goes into its history (intent_events, EventOutcomeNotRecorded), in the
// same transaction; CompleteOutcome tells that case from a retry.
//
// Retrying a Complete whose response was lost is safe: with the same token
// and status it finds the key finished by this very attempt and returns
// (false, nil). A superseded completion deletes the key, so its retry gets
// ErrLostOwnership.
func (s *Store) Complete(ctx context.Context, c Completion) (intentUpdated bool, err error) {
	res, err := s.CompleteOutcome(ctx, c)
	return res.IntentUpdated, err
}

// CompleteResult is what CompleteOutcome did.
type CompleteResult struct {
	// IntentUpdated: the intent's outcome was recorded.
	IntentUpdated bool
	// NotRecorded: the intent already had a final status, which stays;
	// the outcome is recorded under the key and in the intent's history
	// (EventOutcomeNotRecorded). A retry of a Complete whose first call
	// committed answers the same: true when that call put the outcome in
	// the intent's history, else false.
	NotRecorded bool
}

// CompleteOutcome is Complete, and also tells a retry whose first call
// committed (nothing written) from an outcome that could not be recorded on
// the intent because it already had a final status.
func (s *Store) CompleteOutcome(ctx context.Context, c Completion) (CompleteResult, error) {
	var intentUpdated, notRecorded bool
	if err := checkKey(c.Kind, c.Key); err != nil {
		return CompleteResult{}, err
	}
	if c.Token < 1 {
		return CompleteResult{}, invalid("token", "must be at least 1, got %d", c.Token)
	}
	if c.IntentID < 1 {
		return CompleteResult{}, invalid("intent_id", "must be at least 1, got %d", c.IntentID)
	}
	if err := checkOutcomeStatus(c.Status); err != nil {
		return CompleteResult{}, err
	}
	if err := checkResult(c.Result); err != nil {
		return CompleteResult{}, err
	}
	if s.completes != nil {
		res, err := s.completes.Do(ctx, c)
		if !errors.Is(err, errAlone) {
			return res, err
		}
	}
	// Key and intent are written in one transaction so that they never
	// disagree: nobody can see the intent succeeded while its key still
	// looks started (and would be recovered, looked up, perhaps re-sent),
	// or the key completed while a crash left the intent without outcome.
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var (
			state  string
			token  int64
			owner  int64
			status *string
		)
		// Lock the key's row: the token check and the write below must be
		// one atomic step. Without the lock a Begin could take the key over
		// (new token) between our check and our write, and this stale
		// attempt would overwrite the outcome the new owner is finding out.
		// Key before intent, in the same order as Begin, so the two never
		// deadlock.
		err := tx.QueryRow(ctx, s.schema.SQL(`
			SELECT state, token, owner_intent_id, status FROM fencegate.idempotency_keys
			WHERE kind = $1 AND idempotency_key = $2
			FOR UPDATE`), c.Kind, c.Key).Scan(&state, &token, &owner, &status)
		if errors.Is(err, pgx.ErrNoRows) {
			return &OwnershipError{Kind: c.Kind, Key: c.Key, Token: c.Token}
		}
		if err != nil {
			return fmt.Errorf("lock key: %w", err)
		}
		if token != c.Token {
			return &OwnershipError{Kind: c.Kind, Key: c.Key, Token: c.Token, CurrentToken: token, State: State(state)}
		}
		if owner != c.IntentID {
			return invalid("intent_id", "token %d belongs to intent %d, not %d", c.Token, owner, c.IntentID)
		}
		if State(state) != StateStarted {
			// Finished by this very attempt: a retry of Complete after a
			// lost response. Same outcome: nothing to write. A different
			// one: the first call's outcome stands.
			if status != nil && outbox.Status(*status) == c.Status {
				intentUpdated = false
				// If the first call found the intent final already, it
				// put the outcome in the intent's history: say so again,
				// so that the caller counts it whichever answer it got.
				err := tx.QueryRow(ctx, s.schema.SQL(`SELECT EXISTS (SELECT 1 FROM fencegate.intent_events
					WHERE intent_id = $1 AND action = $2 AND starts_with(note, $3))`),
					c.IntentID, EventOutcomeNotRecorded, fmt.Sprintf("outcome %s not recorded", c.Status)).Scan(&notRecorded)
				if err != nil {
					return fmt.Errorf("read the intent's history: %w", err)
				}
				return nil
			}
			return &OwnershipError{Kind: c.Kind, Key: c.Key, Token: c.Token, CurrentToken: token, State: State(state)}
		}

		switch c.Status {
		case outbox.StatusSuperseded:
			_, err = tx.Exec(ctx, s.schema.SQL(`DELETE FROM fencegate.idempotency_keys WHERE kind = $1 AND idempotency_key = $2`), c.Kind, c.Key)
		case outbox.StatusUnknown:
			_, err = tx.Exec(ctx, s.schema.SQL(`
				UPDATE fencegate.idempotency_keys
				SET state = 'held', status = 'unknown', locked_until = NULL,
				    result = $3::jsonb, last_error = $4, updated_at = now()
				WHERE kind = $1 AND idempotency_key = $2`),
				c.Kind, c.Key, intents.NullJSON(c.Result), intents.NullString(c.Error))
		default: // succeeded, failed
			_, err = tx.Exec(ctx, s.schema.SQL(`
				UPDATE fencegate.idempotency_keys
				SET state = 'completed', status = $3, locked_until = NULL,
				    result = $4::jsonb, last_error = $5, completed_at = now(), updated_at = now()
				WHERE kind = $1 AND idempotency_key = $2`),
				c.Kind, c.Key, string(c.Status), intents.NullJSON(c.Result), intents.NullString(c.Error))
		}
		if err != nil {
			return fmt.Errorf("record key outcome: %w", err)
		}
		intentUpdated, err = s.completeIntent(ctx, tx, c.IntentID, c.Status, c.Result, c.Error, c.Proven)
		notRecorded = err == nil && !intentUpdated
		if err != nil {
			return err
		}
		return s.insertAttempt(ctx, tx, c.IntentID, c.Attempt)
	})
	if err != nil {
		var oe *OwnershipError
		var ie *InvalidError
		if errors.As(err, &oe) || errors.As(err, &ie) || errors.Is(err, ErrIntentNotFound) {
			return CompleteResult{}, err
		}
		return CompleteResult{}, fmt.Errorf("idempotency: complete %s/%q: %w", c.Kind, c.Key, err)
	}
	return CompleteResult{IntentUpdated: intentUpdated, NotRecorded: notRecorded}, nil
}

// CompleteIntent records the outcome of an intent that did not own a key —
// superseded before execution, Done because another intent completed the
// same key (pass the Decision's Status and Result), Conflict, or a permanent
// validation error — only while the intent has no final status. It reports
// whether the intent was updated; false means it already had a final status
// (which stays; the outcome goes into its history, EventOutcomeNotRecorded).
// status must be succeeded, failed, unknown or superseded.
func (s *Store) CompleteIntent(ctx context.Context, intentID int64, status outbox.Status, result json.RawMessage, errMsg string) (bool, error) {
	if intentID < 1 {
		return false, invalid("intent_id", "must be at least 1, got %d", intentID)
	}
	if err := checkOutcomeStatus(status); err != nil {
		return false, err
	}
	if err := checkResult(result); err != nil {
		return false, err
	}
	var updated bool
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		updated, err = s.completeIntent(ctx, tx, intentID, status, result, errMsg, false)
		return err
	})
	if err != nil && !errors.Is(err, ErrIntentNotFound) {
		err = fmt.Errorf("idempotency: complete intent %d: %w", intentID, err)
	}
	return updated, err
}

// ownershipError explains why token does not own (kind, key), for the
// single-statement operations whose condition matched no row.
func (s *Store) ownershipError(ctx context.Context, kind, key string, token int64) error {
	var state string
	var current int64
	err := s.pool.QueryRow(ctx, s.schema.SQL(`SELECT state, token FROM fencegate.idempotency_keys WHERE kind = $1 AND idempotency_key = $2`),
		kind, key).Scan(&state, &current)
	if errors.Is(err, pgx.ErrNoRows) {
		return &OwnershipError{Kind: kind, Key: key, Token: token}
	}
	if err != nil {
		return fmt.Errorf("idempotency: read key %s/%q: %w", kind, key, err)
	}
	return &OwnershipError{Kind: kind, Key: key, Token: token, CurrentToken: current, State: State(state)}
}

// releaseSQL deletes the key owned by token $3, only while it is started.
const releaseSQL = `
		DELETE FROM fencegate.idempotency_keys
		WHERE kind = $1 AND idempotency_key = $2 AND token = $3 AND state = 'started' AND ` + durable.Where

// Release drops the key owned by token after an attempt that definitely did
// NOT perform the effect and may be retried (a refusal such as an SMTP 4xx),
// so the next Begin answers Execute. The key is deleted, with its
// fingerprint: nothing happened under it. The intent is not touched. If
// token no longer owns the key, it returns an *OwnershipError and changes
// nothing.
func (s *Store) Release(ctx context.Context, kind, key string, token int64) error {
	if err := checkKey(kind, key); err != nil {
		return err
	}
	// One statement: the token condition is evaluated on the row as it is
	// when the DELETE holds its lock (PostgreSQL re-checks it after waiting
	// for a concurrent writer), so a takeover that committed first makes
	// this match nothing rather than delete the new owner's key.
	tag, err := s.pool.Exec(ctx, s.schema.SQL(releaseSQL), kind, key, token)
	if err != nil {
		return fmt.Errorf("idempotency: release %s/%q: %w", kind, key, err)
	}
	if tag.RowsAffected() == 0 {
		return s.ownershipError(ctx, kind, key, token)
	}
	return nil
}

// Extend renews the lock of the attempt that owns the key with token, to
// LockTimeout from now, for an effect that runs long, and returns the new
// expiry (PostgreSQL's clock). If token no longer owns the key, it returns
// an *OwnershipError. Extending a lock that expired but was not taken over
// is allowed: nobody else owns the key.
func (s *Store) Extend(ctx context.Context, kind, key string, token int64) (time.Time, error) {
	if err := checkKey(kind, key); err != nil {
		return time.Time{}, err
	}
	var until time.Time
	// One statement, conditional on the token: see Release.
	err := s.pool.QueryRow(ctx, s.schema.SQL(`
		UPDATE fencegate.idempotency_keys SET locked_until = clock_timestamp() + $4::interval, updated_at = now()
		WHERE kind = $1 AND idempotency_key = $2 AND token = $3 AND state = 'started' AND `+durable.Where+`
		RETURNING locked_until`), kind, key, token, interval(s.cfg.LockTimeout)).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, s.ownershipError(ctx, kind, key, token)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("idempotency: extend %s/%q: %w", kind, key, err)
	}
	return until, nil
}

// Unhold is the operator's release of a key held with an unknown outcome:
// the key becomes started with an already expired lock and a new token, so
// the next Begin with the same fingerprint answers Recover — look the
// outcome up at the destination first — and no earlier attempt's token
// matches any more. It returns ErrNotFound or ErrNotHeld when the key is
// missing or not held.
func (s *Store) Unhold(ctx context.Context, kind, key string) error {
	if err := checkKey(kind, key); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, s.schema.SQL(`
		UPDATE fencegate.idempotency_keys
		SET state = 'started', status = NULL, locked_until = clock_timestamp(),
		    token = nextval('fencegate.idempotency_token_seq'), updated_at = now()
		WHERE kind = $1 AND idempotency_key = $2 AND state = 'held' AND `+durable.Where), kind, key)
	if err != nil {
		return fmt.Errorf("idempotency: unhold %s/%q: %w", kind, key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	if _, err := s.Get(ctx, kind, key); err != nil {
		return err
	}
	return fmt.Errorf("%w: %s/%q", ErrNotHeld, kind, key)
}

// Get returns the key's row, or ErrNotFound.
func (s *Store) Get(ctx context.Context, kind, key string) (*Key, error) {
	var k Key
	var state string
	var status *string
	var result []byte
	err := s.pool.QueryRow(ctx, s.schema.SQL(`
		SELECT kind, idempotency_key, fingerprint, state, token, owner_intent_id, first_intent_id,
		       locked_until, status, result, last_error, attempts, created_at, updated_at, completed_at, last_io_at
		FROM fencegate.idempotency_keys WHERE kind = $1 AND idempotency_key = $2`), kind, key).Scan(
		&k.Kind, &k.Key, &k.Fingerprint, &state, &k.Token, &k.OwnerIntentID, &k.FirstIntentID,
		&k.LockedUntil, &status, &result, &k.LastError, &k.Attempts, &k.CreatedAt, &k.UpdatedAt, &k.CompletedAt, &k.LastIOAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s/%q", ErrNotFound, kind, key)
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency: get %s/%q: %w", kind, key, err)
	}
	k.State = State(state)
	if status != nil {
		k.Status = outbox.Status(*status)
	}
	if result != nil {
		k.Result = result
	}
	return &k, nil
}
