// Package lease is fencegate's epoch issuer: it grants leases on resources
// and hands out a fencing epoch with every change of authority.
//
// The epoch of a resource lives in its control row in PostgreSQL and only
// ever grows: Acquire increments it in the same transaction that grants the
// lease, Advance registers a larger one issued by an outside lock service,
// and a trigger refuses any update that would lower it. Because the epoch is
// stored durably and committed before the caller sees it, it never goes back,
// also across a PostgreSQL restart.
//
// Lease expiry is judged by PostgreSQL's clock (now()), never a worker's.
// A lease only decides who should be working; it cannot stop a holder that
// paused past its expiry. What stops that holder is the epoch check at the
// destination (outbox.Enqueue, the file adapter). Always run the issuer
// against the primary: an epoch read from a lagging replica can be old.
package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrHeld is returned (wrapped in *HeldError) when another holder's lease on
// the resource is still live.
var ErrHeld = errors.New("lease held by another holder")

// ErrStaleEpoch is returned (wrapped in *StaleEpochError) when the epoch a
// caller supplied is no longer, or never was, the resource's current one.
var ErrStaleEpoch = errors.New("stale epoch")

// ErrInvalid is returned (wrapped in *InvalidError) for bad arguments.
var ErrInvalid = errors.New("invalid input")

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

// StaleEpochError names the resource, the epoch supplied and the current one.
type StaleEpochError struct {
	Resource string
	Supplied int64
	Current  int64
	// Reason says why, when the epoch is current but the call still fails
	// (for example the lease was released or belongs to another holder).
	Reason string
}

func (e *StaleEpochError) Error() string {
	msg := fmt.Sprintf("stale epoch for %q: supplied %d, current %d", e.Resource, e.Supplied, e.Current)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// Is reports whether target is ErrStaleEpoch.
func (e *StaleEpochError) Is(target error) bool { return target == ErrStaleEpoch }

// InvalidError names the argument that is wrong.
type InvalidError struct {
	Field   string
	Message string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Message }

// Is reports whether target is ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

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

// Issuer grants leases and epochs. It is safe for concurrent use.
type Issuer struct {
	pool *pgxpool.Pool
}

// NewIssuer returns an issuer over pool, which must point at the primary.
func NewIssuer(pool *pgxpool.Pool) *Issuer { return &Issuer{pool: pool} }

// ValidateResource checks a resource id.
func ValidateResource(resource string) error {
	return validateID("resource", resource, MaxResourceLen)
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
	return nil
}

func interval(ttl time.Duration) string { return fmt.Sprintf("%d microseconds", ttl.Microseconds()) }

// inTx runs fn in a transaction and commits it. The rollback is deferred with
// a context that is not cancelled, so a cancelled ctx never leaves a
// transaction open on a pooled connection.
func inTx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// lockResource creates the control row on first use and locks it. The lock
// (FOR UPDATE) orders this transaction against every other grant, advance
// and enqueue of the resource: each one sees the outcome of all before it.
func lockResource(ctx context.Context, tx pgx.Tx, resource string) (epoch int64, holder *string, expires *time.Time, live bool, err error) {
	if _, err = tx.Exec(ctx, `INSERT INTO resources (resource_id) VALUES ($1) ON CONFLICT (resource_id) DO NOTHING`, resource); err != nil {
		return 0, nil, nil, false, fmt.Errorf("create resource: %w", err)
	}
	err = tx.QueryRow(ctx, `
		SELECT epoch, holder, lease_expires_at, coalesce(lease_expires_at > now(), false)
		FROM resources WHERE resource_id = $1 FOR UPDATE`, resource).Scan(&epoch, &holder, &expires, &live)
	if err != nil {
		return 0, nil, nil, false, fmt.Errorf("lock resource: %w", err)
	}
	return epoch, holder, expires, live, nil
}

// Acquire grants holder a lease of ttl on resource when the resource is free
// or its lease has expired by PostgreSQL's clock, and increments the epoch in
// the same transaction. When holder already holds a live lease, the lease is
// extended and the same epoch returned. Otherwise it returns a *HeldError.
func (i *Issuer) Acquire(ctx context.Context, resource, holder string, ttl time.Duration) (Lease, error) {
	if err := ValidateResource(resource); err != nil {
		return Lease{}, err
	}
	if err := validateID("holder", holder, MaxHolderLen); err != nil {
		return Lease{}, err
	}
	if err := validateTTL(ttl); err != nil {
		return Lease{}, err
	}
	var l Lease
	err := inTx(ctx, i.pool, func(tx pgx.Tx) error {
		epoch, cur, expires, live, err := lockResource(ctx, tx, resource)
		if err != nil {
			return err
		}
		if live && cur != nil && *cur != holder {
			return &HeldError{Resource: resource, Holder: *cur, Epoch: epoch, ExpiresAt: *expires}
		}
		// Same holder, live lease: keep the epoch (its writes stay valid).
		// Otherwise authority changes hands, so the epoch must grow, in this
		// same transaction, before anyone can see the new holder.
		next := epoch + 1
		if live && cur != nil && *cur == holder {
			next = epoch
		}
		l = Lease{Resource: resource, Holder: holder, Epoch: next}
		return tx.QueryRow(ctx, `
			UPDATE resources
			SET epoch = $2, holder = $3, lease_expires_at = now() + $4::interval,
			    renewed_at = now(), updated_at = now()
			WHERE resource_id = $1
			RETURNING lease_expires_at`, resource, next, holder, interval(ttl)).Scan(&l.ExpiresAt)
	})
	if err != nil {
		return Lease{}, wrap("acquire", err)
	}
	return l, nil
}

// Renew extends holder's lease on resource by ttl from now (PostgreSQL's
// clock), only while epoch is still the current epoch and held by holder.
// A lease that expired but was not taken over is still current and can be
// renewed. Otherwise it returns a *StaleEpochError.
func (i *Issuer) Renew(ctx context.Context, resource, holder string, epoch int64, ttl time.Duration) (Lease, error) {
	if err := ValidateResource(resource); err != nil {
		return Lease{}, err
	}
	if err := validateID("holder", holder, MaxHolderLen); err != nil {
		return Lease{}, err
	}
	if err := validateEpoch(epoch); err != nil {
		return Lease{}, err
	}
	if err := validateTTL(ttl); err != nil {
		return Lease{}, err
	}
	l := Lease{Resource: resource, Holder: holder, Epoch: epoch}
	// One conditional UPDATE: the check and the extension are a single atomic
	// step, so no takeover can slip between them.
	err := i.pool.QueryRow(ctx, `
		UPDATE resources
		SET lease_expires_at = now() + $4::interval, renewed_at = now(), updated_at = now()
		WHERE resource_id = $1 AND epoch = $2 AND holder = $3
		RETURNING lease_expires_at`, resource, epoch, holder, interval(ttl)).Scan(&l.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, i.staleError(ctx, resource, holder, epoch)
	}
	if err != nil {
		return Lease{}, wrap("renew", err)
	}
	return l, nil
}

// staleError explains why a conditional update matched nothing.
func (i *Issuer) staleError(ctx context.Context, resource, holder string, epoch int64) error {
	var cur int64
	var curHolder *string
	err := i.pool.QueryRow(ctx, `SELECT epoch, holder FROM resources WHERE resource_id = $1`, resource).Scan(&cur, &curHolder)
	if errors.Is(err, pgx.ErrNoRows) {
		return &StaleEpochError{Resource: resource, Supplied: epoch, Current: 0, Reason: "no epoch was ever issued for this resource"}
	}
	if err != nil {
		return wrap("read resource", err)
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
	if err := ValidateResource(resource); err != nil {
		return err
	}
	if err := validateID("holder", holder, MaxHolderLen); err != nil {
		return err
	}
	if err := validateEpoch(epoch); err != nil {
		return err
	}
	tag, err := i.pool.Exec(ctx, `
		UPDATE resources
		SET holder = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE resource_id = $1 AND epoch = $2 AND (holder = $3 OR holder IS NULL)`, resource, epoch, holder)
	if err != nil {
		return wrap("release", err)
	}
	if tag.RowsAffected() == 0 {
		return i.staleError(ctx, resource, holder, epoch)
	}
	return nil
}

// Advance registers an epoch issued by an outside lock service (an etcd
// revision, a Kubernetes lease's transition count). It is accepted only when
// strictly greater than the current epoch, and then clears any lease held
// here, since authority now comes from outside; an equal epoch is a
// successful no-op; a lower one returns a *StaleEpochError. The resource is
// created on first use.
func (i *Issuer) Advance(ctx context.Context, resource string, epoch int64) (Resource, error) {
	if err := ValidateResource(resource); err != nil {
		return Resource{}, err
	}
	if err := validateEpoch(epoch); err != nil {
		return Resource{}, err
	}
	var r Resource
	err := inTx(ctx, i.pool, func(tx pgx.Tx) error {
		cur, _, _, _, err := lockResource(ctx, tx, resource)
		if err != nil {
			return err
		}
		switch {
		case epoch < cur:
			return &StaleEpochError{Resource: resource, Supplied: epoch, Current: cur}
		case epoch == cur:
			r = Resource{Resource: resource, Epoch: cur}
			return nil
		}
		if _, err := tx.Exec(ctx, `
			UPDATE resources SET epoch = $2, holder = NULL, lease_expires_at = NULL, updated_at = now()
			WHERE resource_id = $1`, resource, epoch); err != nil {
			return err
		}
		r = Resource{Resource: resource, Epoch: epoch}
		return nil
	})
	if err != nil {
		return Resource{}, wrap("advance", err)
	}
	return r, nil
}

// Get returns the resource's control row.
func (i *Issuer) Get(ctx context.Context, resource string) (Resource, error) {
	if err := ValidateResource(resource); err != nil {
		return Resource{}, err
	}
	r := Resource{Resource: resource}
	var holder *string
	err := i.pool.QueryRow(ctx, `
		SELECT epoch, holder, lease_expires_at, coalesce(lease_expires_at > now(), false)
		FROM resources WHERE resource_id = $1`, resource).Scan(&r.Epoch, &holder, &r.LeaseExpiresAt, &r.LeaseLive)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, nil
	}
	if err != nil {
		return Resource{}, wrap("get resource", err)
	}
	if holder != nil {
		r.Holder = *holder
	}
	return r, nil
}

func wrap(op string, err error) error {
	var held *HeldError
	var stale *StaleEpochError
	var inv *InvalidError
	if errors.As(err, &held) || errors.As(err, &stale) || errors.As(err, &inv) {
		return err
	}
	return fmt.Errorf("lease: %s: %w", op, err)
}
