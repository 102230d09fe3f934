// Package lease is fencegate's epoch issuer: it grants leases on resources
// and hands out a new fencing epoch with every grant.
//
// The epoch of a resource lives in its control row in PostgreSQL and only
// ever grows: every successful Acquire increments it in the same
// transaction that grants the lease (also for the holder that already holds
// a live lease: every grant is a new fencing token; Renew extends a lease
// and keeps its epoch), Advance registers a larger one issued by an outside
// lock service, and a trigger refuses any update that would lower it.
// Epochs stop at MaxEpoch (2^53). Because the epoch is
// stored durably and committed before the caller sees it, it never goes back,
// also across a PostgreSQL restart.
//
// Lease expiry is judged by PostgreSQL's clock (now()), never a worker's.
// A lease only decides who should be working; it cannot stop a holder that
// paused past its expiry. What stops that holder is the epoch check at the
// destination (outbox.Enqueue, the file adapter). Always run the issuer
// against the primary: an epoch read from a lagging replica can be old.
//
// Every grant (Acquire, Advance) also checks that the database is the
// epoch authority on record (its system identifier and WAL timeline,
// recorded in the table epoch_authority). After a failover to an
// asynchronous standby (a higher timeline) the first grant raises every
// epoch by the failover jump (WithFailoverEpochJump), past what the old
// primary may have granted that the standby never received; another
// database, or a lower timeline, is refused with ErrAuthorityChanged. See
// docs/guarantees.md, "After a failover".
package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/durable"
	"github.com/fencegate/fencegate/internal/fencemetrics"
	"github.com/fencegate/fencegate/internal/kindcheck"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/policy"
)

// ErrHeld is returned (wrapped in *HeldError) when another holder's lease on
// the resource is still live.
var ErrHeld = errors.New("lease held by another holder")

// ErrStaleEpoch is returned (wrapped in *StaleEpochError) when the epoch a
// caller supplied is no longer, or never was, the resource's current one.
// It is fenceerr.ErrStaleEpoch, the same sentinel as outbox.ErrStaleEpoch:
// errors.Is(err, lease.ErrStaleEpoch) holds for a stale enqueue too.
var ErrStaleEpoch = fenceerr.ErrStaleEpoch

// ErrInvalid is returned (wrapped in *InvalidError) for bad arguments. It
// is fenceerr.ErrInvalid, shared with outbox, idempotency and admin.
var ErrInvalid = fenceerr.ErrInvalid

// HeldError says who holds the lease and until when (PostgreSQL's clock).
type HeldError struct {
	Resource  string
	Holder    string
	Epoch     int64
	ExpiresAt time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease on %q held by %q (epoch %d) until %s",
		e.Resource, e.Holder, e.Epoch, e.ExpiresAt.UTC().Format(time.RFC3339Nano))
}

// Is reports whether target is ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// StaleEpochError names the resource, the epoch supplied and the current
// one, and why when the epoch is current but the call still fails
// (Reason). It is fenceerr.StaleEpochError, the outbox's type too.
type StaleEpochError = fenceerr.StaleEpochError

// ErrBusy is returned (wrapped in *BusyError) when a grant (Acquire, Renew,
// Release, Advance) gave up waiting for the resource's control-row lock
// after the issuer's lock timeout (WithLockTimeout). Nothing was granted or
// changed; retry. It is fenceerr.ErrBusy, which an enqueue that gave up
// (outbox.BusyError) matches too.
var ErrBusy = fenceerr.ErrBusy

// BusyError names the resource whose control row stayed locked, the grant
// that gave up and how long it waited.
type BusyError struct {
	Resource string
	// Op is the grant that gave up: acquire, renew, release or advance.
	Op string
	// Waited is the issuer's lock timeout (0 when the bound came from the
	// server's own lock_timeout).
	Waited time.Duration
}

func (e *BusyError) Error() string {
	waited := ""
	if e.Waited > 0 {
		waited = " after " + e.Waited.String()
	}
	return fmt.Sprintf("lease: %s %q: busy: the resource's control row is locked by an open transaction "+
		"(e.g. a worker paused inside outbox.EnqueueTx); gave up%s; retry", e.Op, e.Resource, waited)
}

// Is reports whether target is ErrBusy.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// InvalidError names the argument that is wrong. It is
// fenceerr.InvalidError, the one invalid-input type of the module.
type InvalidError = fenceerr.InvalidError

// Lease is a granted lease.
type Lease struct {
	Resource string `json:"resource"`
	Holder   string `json:"holder"`
	Epoch    int64  `json:"epoch"`
	// ExpiresAt is the expiry by PostgreSQL's clock. Don't compare it with
	// the local wall clock to decide ownership; Keeper uses the monotonic
	// clock instead.
	ExpiresAt time.Time `json:"expires_at"`
}

// Resource is a resource's control row.
type Resource struct {
	Resource       string     `json:"resource"`
	Epoch          int64      `json:"epoch"`
	Holder         string     `json:"holder,omitempty"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	LeaseLive      bool       `json:"lease_live"`
}

// Limits on identifiers, in bytes.
const (
	MaxResourceLen = 200
	MaxHolderLen   = 200
	MinTTL         = 10 * time.Millisecond
	MaxTTL         = 24 * time.Hour
)

// MaxEpoch is the largest epoch the issuer grants or accepts: 2^53
// (9007199254740992), the largest integer every JSON client reads exactly
// (a float64 above it rounds, and two different epochs could read alike).
// An epoch above it is bad input naming "epoch" everywhere (Advance, Renew,
// Release, outbox.Enqueue); a resource whose epoch reached it has exhausted
// its epochs and Acquire refuses it, instead of overflowing int64.
const MaxEpoch int64 = 1 << 53

// DefaultLockTimeout is how long a grant waits for the resource's control-row
// lock by default (see WithLockTimeout).
const DefaultLockTimeout = 5 * time.Second

// DefaultFailoverEpochJump is how far the first grant after a failover
// raises every epoch by default (see WithFailoverEpochJump).
const DefaultFailoverEpochJump int64 = 1_000_000

// Issuer grants leases and epochs. It is safe for concurrent use.
type Issuer struct {
	pool *pgxpool.Pool
	m    *metrics
	// lockTimeout bounds each grant's wait for the control-row lock; 0: no
	// bound.
	lockTimeout time.Duration
	// failoverJump is how far the first grant after a promotion raises
	// every epoch (WithFailoverEpochJump).
	failoverJump int64
	// schema is the schema of fencegate's tables (WithSchema); schemaErr
	// its refusal, returned by every call.
	schema    pgschema.Schema
	schemaErr error
	// principal is who this issuer grants for (AsPrincipal).
	principal string
}

// NewIssuer returns an issuer over pool, which must point at the primary
// (see RequirePrimary). A nil pool (and an Issuer that NewIssuer did not
// make, such as a zero Issuer{}) grants nothing: every call returns a
// *fenceerr.InvalidError naming pool.
func NewIssuer(pool *pgxpool.Pool, opts ...Option) *Issuer {
	o := options{lockTimeout: DefaultLockTimeout, failoverJump: DefaultFailoverEpochJump}
	for _, opt := range opts {
		opt(&o)
	}
	i := &Issuer{pool: pool, m: newMetrics(o.reg), lockTimeout: max(o.lockTimeout, 0), failoverJump: o.failoverJump, principal: o.principal}
	i.schema, i.schemaErr = pgschema.Parse(o.schema)
	if i.schemaErr != nil {
		i.schemaErr = &InvalidError{Field: "schema", Message: strings.TrimPrefix(i.schemaErr.Error(), "schema: ")}
	}
	return i
}

// usable is the refusal every call of an issuer that cannot run returns
// first: no pool (NewIssuer(nil), a zero or nil Issuer, which has no
// metrics either), or a bad schema (WithSchema). Nil when it can run.
func (i *Issuer) usable() error {
	if i == nil || i.pool == nil {
		return &InvalidError{Field: "pool", Message: "must not be nil (an Issuer is made by NewIssuer with a pool)"}
	}
	return i.schemaErr
}

// ValidateResource checks a resource id: not empty, at most
// MaxResourceLen bytes, no NUL, invalid UTF-8, control or format character
// (kindcheck.Invisible: an id that reads as another on a page or in a log).
func ValidateResource(resource string) error {
	return validateID("resource", resource, MaxResourceLen)
}

func validateHolder(holder string) error { return validateID("holder", holder, MaxHolderLen) }

// firstErr is the first of errs that is not nil: an operation's argument
// checks, in the order of its parameters, so that a call with several bad
// arguments is told about the first.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func validateID(field, v string, max int) error {
	switch {
	case v == "":
		return &InvalidError{Field: field, Message: "must not be empty"}
	case len(v) > max:
		return &InvalidError{Field: field, Message: fmt.Sprintf("must be at most %d bytes, got %d", max, len(v))}
	}
	for _, r := range v {
		if r == 0 || r == '\uFFFD' {
			return &InvalidError{Field: field, Message: "must be valid UTF-8 without NUL characters"}
		}
	}
	if r, ok := kindcheck.Invisible(v); ok {
		return &InvalidError{Field: field, Message: fmt.Sprintf("must not contain control or format characters, got %U", r)}
	}
	return nil
}

func validateTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL {
		return &InvalidError{Field: "ttl", Message: fmt.Sprintf("must be between %s and %s, got %s", MinTTL, MaxTTL, ttl)}
	}
	return nil
}

func validateEpoch(epoch int64) error {
	if epoch < 1 {
		return &InvalidError{Field: "epoch", Message: fmt.Sprintf("must be at least 1, got %d", epoch)}
	}
	if epoch > MaxEpoch {
		return &InvalidError{Field: "epoch", Message: fmt.Sprintf("must be at most %d (2^53), got %d", MaxEpoch, epoch)}
	}
	return nil
}

func interval(ttl time.Duration) string { return fmt.Sprintf("%d microseconds", ttl.Microseconds()) }

// inTx runs fn in a transaction and commits it. The rollback is deferred with
// a context that is not cancelled, so a cancelled ctx never leaves a
// transaction open on a pooled connection.
func inTx(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	// durable: a grant acknowledged to the worker must survive a crash
	// whatever the server's synchronous_commit (see internal/durable).
	return durable.InTx(ctx, pool, opts, fn)
}

// grantTx runs fn in a grant's transaction (inTx) whose waits for locks are
// bounded by the issuer's lock timeout. SET LOCAL comes first, before
// anything that can wait for the control-row lock, and lasts only until
// this transaction ends, so the pooled connection keeps its own setting.
//
// The rule set's check (package policy) comes with the BEGIN too, before
// anything that creates or locks the resource's control row: the grant's
// principal (WithPrincipal, else AsPrincipal) is set for the transaction
// and fencegate_check_principal refuses, once a rule set is applied, a
// resource outside its scope (epochs: an advance, which needs the
// principal's epochs right) or a caller naming no principal. Without a
// rule set it allows everything, as before.
func (i *Issuer) grantTx(ctx context.Context, resource string, epochs bool, fn func(pgx.Tx) error) error {
	begin := "BEGIN"
	if i.lockTimeout > 0 {
		// Whole milliseconds, rounded up: a positive bound never becomes
		// 0, which PostgreSQL reads as "wait forever". Sent with the BEGIN
		// (simple protocol), so the bound costs no round trip.
		ms := (i.lockTimeout + time.Millisecond - 1) / time.Millisecond
		begin = fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d", ms)
	}
	// Literals, not parameters: the simple protocol takes none. Both are
	// checked strings (no NUL), quoted as E'' literals, which read the
	// same whatever standard_conforming_strings says.
	var principal string
	if p := i.principalFor(ctx); p != nil {
		principal = *p
	}
	// The schema's name goes into the statement before the literals do, so
	// that a resource named like one of fencegate's objects is never
	// renamed.
	check := fmt.Sprintf(i.schema.SQL("; SELECT set_config('fencegate.principal', %s, true), fencegate.fencegate_check_principal(%s, NULL, %t)"),
		literal(principal), literal(resource), epochs)
	err := inTx(ctx, i.pool, pgx.TxOptions{BeginQuery: begin + check}, fn)
	return policy.Refusal(err)
}

// literal quotes s as a PostgreSQL escape string literal.
func literal(s string) string {
	return "E'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + "'"
}

// control is a resource's control row as lockResource found it.
type control struct {
	epoch   int64
	holder  *string
	expires *time.Time
	live    bool
	// sinceRenewal is now() minus renewed_at, in microseconds, by
	// PostgreSQL's clock; nil when the resource was never granted here.
	sinceRenewal *int64
}

// lockResource checks that the database is still the epoch authority,
// creates the control row on first use and locks it. The lock (FOR UPDATE)
// orders this transaction against every other grant, advance and enqueue
// of the resource: each one sees the outcome of all before it.
//
// The authority check (fencegate_epoch_authority, migrations/functions/epoch.sql) runs in
// the first statement, at no extra round trip, and before the one that
// locks and reads the epoch: after a promotion it raises every epoch by
// jump in this same transaction (or waits for the grant that does), so the
// epoch read below is already past anything the old primary granted; a new
// resource starts from the floor it returns, past the epochs the old
// primary may have granted to resources this database never saw. A
// database that is not the authority on record fails here with SQLSTATE
// ZF001 (an *AuthorityError, see wrapGrant), nothing changed.
func (i *Issuer) lockResource(ctx context.Context, tx pgx.Tx, resource string, jump int64) (control, error) {
	if _, err := tx.Exec(ctx, i.schema.SQL(`
		INSERT INTO fencegate.resources (resource_id, epoch) SELECT $1, fencegate.fencegate_epoch_authority($2)
		ON CONFLICT (resource_id) DO NOTHING`), resource, jump); err != nil {
		return control{}, fmt.Errorf("create resource: %w", err)
	}
	var c control
	err := tx.QueryRow(ctx, i.schema.SQL(`
		SELECT epoch, holder, lease_expires_at, coalesce(lease_expires_at > now(), false),
		       (extract(epoch FROM now() - renewed_at) * 1000000)::bigint
		FROM fencegate.resources WHERE resource_id = $1 FOR UPDATE`), resource).Scan(&c.epoch, &c.holder, &c.expires, &c.live, &c.sinceRenewal)
	if err != nil {
		return control{}, fmt.Errorf("lock resource: %w", err)
	}
	return c, nil
}

// Acquire grants holder a lease of ttl on resource when the resource is free,
// its lease has expired by PostgreSQL's clock, or holder itself holds it, and
// increments the epoch in the same transaction: every successful Acquire
// returns a new, higher epoch, also for the holder that already holds a live
// lease (the writes of its previous epoch are fenced out from then on; a
// retried Acquire after a lost response simply gets another epoch). To
// extend a lease and keep its epoch, use Renew. A live lease of another
// holder returns a *HeldError; a resource whose epoch reached MaxEpoch
// returns an *InvalidError naming "epoch" (its epochs are exhausted); a
// control row locked past the lock timeout returns a *BusyError.
func (i *Issuer) Acquire(ctx context.Context, resource, holder string, ttl time.Duration) (Lease, error) {
	if err := firstErr(i.usable(), ValidateResource(resource), validateHolder(holder), validateTTL(ttl)); err != nil {
		return Lease{}, err
	}
	var l Lease
	var g *Grant
	err := i.grantTx(ctx, resource, false, func(tx pgx.Tx) error {
		c, err := i.lockResource(ctx, tx, resource, i.failoverJump)
		if err != nil {
			return err
		}
		if c.live && c.holder != nil && *c.holder != holder {
			return &HeldError{Resource: resource, Holder: *c.holder, Epoch: c.epoch, ExpiresAt: *c.expires}
		}
		// Checked before the increment, so the epoch never passes the
		// ceiling (nor wraps around int64): refused, nothing changed.
		if c.epoch >= MaxEpoch {
			return &InvalidError{Field: "epoch", Message: fmt.Sprintf(
				"the resource's epochs are exhausted: %q is at epoch %d, the ceiling (2^53); no new epoch can be granted for it "+
					"(a live holder can still renew); use a new resource id", resource, c.epoch)}
		}
		// Every grant is a new epoch, the same holder's too: a second grant
		// sharing the first's epoch could not be told apart from it at the
		// destination (an orphaned grant after a lost response, or a worker
		// loop's previous iteration, would keep writing). It grows in this
		// same transaction, before anyone can see the grant.
		next := c.epoch + 1
		l = Lease{Resource: resource, Holder: holder, Epoch: next}
		if err := tx.QueryRow(ctx, i.schema.SQL(`
			UPDATE fencegate.resources
			SET epoch = $2, holder = $3, lease_expires_at = now() + $4::interval,
			    renewed_at = now(), updated_at = now()
			WHERE resource_id = $1
			RETURNING lease_expires_at`), resource, next, holder, interval(ttl)).Scan(&l.ExpiresAt); err != nil {
			return err
		}
		g, err = i.acquireGrant(ctx, tx, resource, holder, next, c)
		if err != nil {
			return err
		}
		return i.recordGrant(ctx, tx, g)
	})
	if err != nil {
		return Lease{}, i.wrapGrant(ctx, "acquire", resource, err)
	}
	if g != nil {
		i.m.takeovers.WithLabelValues(string(g.How)).Inc()
	}
	return l, nil
}

// Renew extends holder's lease on resource by ttl from now (PostgreSQL's
// clock), only while epoch is still the current epoch and held by holder.
// A lease that expired but was not taken over is still current and can be
// renewed. Otherwise it returns a *StaleEpochError. Renew waits for the
// control-row lock at most the issuer's lock timeout (then *BusyError).
func (i *Issuer) Renew(ctx context.Context, resource, holder string, epoch int64, ttl time.Duration) (Lease, error) {
	if err := firstErr(i.usable(), ValidateResource(resource), validateHolder(holder), validateEpoch(epoch), validateTTL(ttl)); err != nil {
		return Lease{}, err
	}
	l := Lease{Resource: resource, Holder: holder, Epoch: epoch}
	// One conditional UPDATE: the check and the extension are a single atomic
	// step, so no takeover can slip between them.
	//
	// The sub-select locks the row and reads the expiry as it was before this
	// update, so the renew margin (time left on the lease when the renewal
	// arrived, by PostgreSQL's clock) costs no extra round trip. RETURNING
	// alone would only see the new expiry. It runs in a grant transaction
	// for the lock timeout only: the statement alone is atomic.
	var margin *float64
	err := i.grantTx(ctx, resource, false, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, i.schema.SQL(`
			UPDATE fencegate.resources r
			SET lease_expires_at = now() + $4::interval, renewed_at = now(), updated_at = now()
			FROM (SELECT resource_id, lease_expires_at FROM fencegate.resources WHERE resource_id = $1 FOR UPDATE) old
			WHERE r.resource_id = old.resource_id AND r.epoch = $2 AND r.holder = $3
			RETURNING r.lease_expires_at, extract(epoch FROM old.lease_expires_at - now())::float8`),
			resource, epoch, holder, interval(ttl)).Scan(&l.ExpiresAt, &margin)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		err = i.staleError(ctx, resource, holder, epoch)
		if errors.Is(err, ErrStaleEpoch) {
			i.m.stale.WithLabelValues(fencemetrics.WhereRenew).Inc()
		}
		return Lease{}, err
	}
	if err != nil {
		return Lease{}, i.wrapGrant(ctx, "renew", resource, err)
	}
	if margin != nil {
		i.m.renewMargin.Observe(*margin)
	}
	return l, nil
}

// staleError explains why a conditional update matched nothing.
func (i *Issuer) staleError(ctx context.Context, resource, holder string, epoch int64) error {
	var cur int64
	var curHolder *string
	err := i.pool.QueryRow(ctx, i.schema.SQL(`SELECT epoch, holder FROM fencegate.resources WHERE resource_id = $1`), resource).Scan(&cur, &curHolder)
	if errors.Is(err, pgx.ErrNoRows) {
		return &StaleEpochError{Resource: resource, Supplied: epoch, Current: 0, Reason: "no epoch was ever issued for this resource"}
	}
	if err != nil {
		return i.wrap(ctx, "read resource", err)
	}
	e := &StaleEpochError{Resource: resource, Supplied: epoch, Current: cur}
	if cur == epoch {
		switch {
		case curHolder == nil:
			e.Reason = "the lease was released"
		case *curHolder != holder:
			e.Reason = fmt.Sprintf("the lease is held by %q", *curHolder)
		}
	}
	return e
}

// Release frees holder's lease on resource. The epoch stays, so the next
// Acquire gets epoch+1. Releasing an already released lease of the current
// epoch succeeds. Otherwise it returns a *StaleEpochError.
func (i *Issuer) Release(ctx context.Context, resource, holder string, epoch int64) error {
	if err := firstErr(i.usable(), ValidateResource(resource), validateHolder(holder), validateEpoch(epoch)); err != nil {
		return err
	}
	var released int64
	err := i.grantTx(ctx, resource, false, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, i.schema.SQL(`
			UPDATE fencegate.resources
			SET holder = NULL, lease_expires_at = NULL, updated_at = now()
			WHERE resource_id = $1 AND epoch = $2 AND (holder = $3 OR holder IS NULL)`), resource, epoch, holder)
		released = tag.RowsAffected()
		return err
	})
	if err != nil {
		return i.wrapGrant(ctx, "release", resource, err)
	}
	if released == 0 {
		return i.staleError(ctx, resource, holder, epoch)
	}
	return nil
}

// Advance registers an epoch issued by an outside lock service (an etcd
// revision, a Kubernetes lease's transition count). It is accepted only when
// strictly greater than the current epoch, and then clears any lease held
// here, since authority now comes from outside; an equal epoch is a
// successful no-op; a lower one returns a *StaleEpochError; one above
// MaxEpoch an *InvalidError naming "epoch". The resource is created on first
// use.
func (i *Issuer) Advance(ctx context.Context, resource string, epoch int64) (Resource, error) {
	if err := firstErr(i.usable(), ValidateResource(resource), validateEpoch(epoch)); err != nil {
		return Resource{}, err
	}
	var r Resource
	var g *Grant
	err := i.grantTx(ctx, resource, true, func(tx pgx.Tx) error {
		c, err := i.lockResource(ctx, tx, resource, i.failoverJump)
		if err != nil {
			return err
		}
		switch {
		case epoch < c.epoch:
			return &StaleEpochError{Resource: resource, Supplied: epoch, Current: c.epoch}
		case epoch == c.epoch:
			r = Resource{Resource: resource, Epoch: c.epoch}
			return nil
		}
		if _, err := tx.Exec(ctx, i.schema.SQL(`
			UPDATE fencegate.resources SET epoch = $2, holder = NULL, lease_expires_at = NULL, updated_at = now()
			WHERE resource_id = $1`), resource, epoch); err != nil {
			return err
		}
		r = Resource{Resource: resource, Epoch: epoch}
		g = &Grant{Resource: resource, Epoch: epoch, How: HowExternalAdvance, PreviousEpoch: c.epoch}
		if c.holder != nil {
			g.PreviousHolder = *c.holder
			g.SincePreviousRenewal = micros(c.sinceRenewal)
		}
		return i.recordGrant(ctx, tx, g)
	})
	if err != nil {
		return Resource{}, i.wrapGrant(ctx, "advance", resource, err)
	}
	if g != nil {
		i.m.takeovers.WithLabelValues(string(g.How)).Inc()
	}
	return r, nil
}

// Get returns the resource's control row.
func (i *Issuer) Get(ctx context.Context, resource string) (Resource, error) {
	if err := firstErr(i.usable(), ValidateResource(resource)); err != nil {
		return Resource{}, err
	}
	r := Resource{Resource: resource}
	var holder *string
	err := i.pool.QueryRow(ctx, i.schema.SQL(`
		SELECT epoch, holder, lease_expires_at, coalesce(lease_expires_at > now(), false)
		FROM fencegate.resources WHERE resource_id = $1`), resource).Scan(&r.Epoch, &holder, &r.LeaseExpiresAt, &r.LeaseLive)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, nil
	}
	if err != nil {
		return Resource{}, i.wrap(ctx, "get resource", err)
	}
	if holder != nil {
		r.Holder = *holder
	}
	return r, nil
}

// wrapGrant is wrap for a grant on resource: a lock wait that ran into the
// lock timeout (SQLSTATE 55P03, lock_not_available) becomes a *BusyError,
// a refusal of the epoch authority check (SQLSTATE ZF001) an
// *AuthorityError.
func (i *Issuer) wrapGrant(ctx context.Context, op, resource string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return &BusyError{Resource: resource, Op: op, Waited: i.lockTimeout}
	}
	if isAuthorityRefusal(err) {
		return i.authorityError(ctx, op, resource, err)
	}
	return i.wrap(ctx, op, err)
}

// wrap passes the package's typed errors through and wraps any other with
// the operation. A write refused because the transaction is read-only
// (SQLSTATE 25006) is checked against pg_is_in_recovery(), so a pool that
// points at a standby gets ErrStandby, not a puzzling read-only error,
// even without RequirePrimary.
func (i *Issuer) wrap(ctx context.Context, op string, err error) error {
	var held *HeldError
	var stale *StaleEpochError
	var inv *InvalidError
	var busy *BusyError
	var auth *AuthorityError
	if errors.As(err, &held) || errors.As(err, &stale) || errors.As(err, &inv) || errors.As(err, &busy) ||
		errors.As(err, &auth) || errors.Is(err, ErrStandby) || errors.Is(err, fenceerr.ErrForbidden) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "25006" {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if cerr := CheckPrimary(cctx, i.pool); errors.Is(cerr, ErrStandby) {
			return fmt.Errorf("lease: %s: %w", op, cerr)
		}
	}
	return fmt.Errorf("lease: %s: %w", op, err)
}
