package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrStandby is returned when the database is a standby (in recovery).
// Epochs must come from the one linearizable place that grants them: an
// epoch read on a replica may be old, and a replica cannot grant one.
var ErrStandby = errors.New("database is in recovery (a standby); epochs must come from the primary")

// Querier is what CheckPrimary needs: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckPrimary returns ErrStandby when db is in recovery, nil on a
// primary, the query's error when it cannot tell, and an *InvalidError
// naming db when db is nil.
func CheckPrimary(ctx context.Context, db Querier) error {
	if noQuerier(db) {
		return &InvalidError{Field: "db", Message: "must not be nil (a *pgxpool.Pool, *pgx.Conn or pgx.Tx)"}
	}
	var inRecovery bool
	if err := db.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil {
		return fmt.Errorf("lease: check for a primary: %w", err)
	}
	if inRecovery {
		return ErrStandby
	}
	return nil
}

// noQuerier reports a nil db, or a nil pool or connection in it, each of
// which would panic on the first query.
func noQuerier(db Querier) bool {
	switch q := db.(type) {
	case nil:
		return true
	case *pgxpool.Pool:
		return q == nil
	case *pgx.Conn:
		return q == nil
	}
	return false
}

// RequirePrimary makes every new connection of a pool built from cfg check
// that it talks to a primary, and fail with ErrStandby otherwise. Use it for
// every pool that grants epochs or enqueues intents (lease.Issuer,
// outbox.Client). Any AfterConnect hook already set runs first.
//
// Checking once per connection is enough, and costs one query per
// connection instead of one per call: a server only ever leaves recovery
// (promotion), never enters it while running. A standby that is promoted
// makes its existing connections primary connections, which is safe; a
// primary becomes a standby only by being shut down and restarted from a
// base backup or pg_rewind, and a shutdown closes every connection, so no
// connection that passed this check can ever find itself on a standby.
// (What a pool cannot see is a failover to a different server behind the
// same address: see docs/guarantees.md, "Why epochs come from one place".)
func RequirePrimary(cfg *pgxpool.Config) {
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if prev != nil {
			if err := prev(ctx, conn); err != nil {
				return err
			}
		}
		return CheckPrimary(ctx, conn)
	}
}
