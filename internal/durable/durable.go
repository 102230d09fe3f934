// Package durable makes the transactions that decide authority or ownership
// durable when they are acknowledged, whatever the server's or the
// database's synchronous_commit.
//
// With synchronous_commit=off (a common tuning) PostgreSQL acknowledges a
// COMMIT before its WAL record reaches disk; a crash within the next few
// wal_writer_delay periods loses it. For most data that is a fair trade. For
// a grant it is not: the worker was told "you hold epoch 34", the database
// forgets, and after the restart another holder is handed 34 again — two
// holders with one token. The same goes for an enqueued intent the worker
// was told is committed, an idempotency key an attempt was told it owns, an
// outcome recorded before the message is acked, and an operator's action.
//
// Every such transaction raises synchronous_commit to on for itself (SET
// LOCAL semantics) when the session's value is off or local; a stronger
// setting (remote_write, remote_apply) is kept. Three ways, one rule:
//
//   - [TxOptions] / [Begin]: the BEGIN of an explicit transaction carries
//     the setting, in the same round trip (simple protocol, two statements);
//   - [Where]: a condition to AND into a single statement's WHERE clause
//     (or a SELECT's), for statements run outside an explicit transaction
//     or inside a caller's (EnqueueTx), at no extra round trip;
//   - [ConfigurePool]: the gateway's own pools raise it for the session
//     when a connection is made, as a second line of defence.
//
// The local setting lasts until the end of the transaction it is made in,
// and PostgreSQL reads synchronous_commit when it writes the commit record,
// so setting it anywhere before COMMIT is enough.
package durable

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SetLocalSQL raises synchronous_commit to on for the current transaction
// when it is off or local.
const SetLocalSQL = `SELECT set_config('synchronous_commit', 'on', true) WHERE current_setting('synchronous_commit') IN ('off', 'local')`

// setSessionSQL is SetLocalSQL for the whole session.
const setSessionSQL = `SELECT set_config('synchronous_commit', 'on', false) WHERE current_setting('synchronous_commit') IN ('off', 'local')`

// Where is a boolean SQL expression that is always true and, as a side
// effect, raises synchronous_commit to on for the current transaction when
// it is off or local. AND it into the WHERE clause of the statement whose
// commit must be durable: `... WHERE intent_id = $1 AND ` + durable.Where.
// It is evaluated at least once whenever the statement touches a row (and a
// statement that touches none has nothing to make durable).
const Where = `(CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN set_config('synchronous_commit', 'on', true) IS NOT NULL ELSE true END)`

// TxOptions returns o with a BeginQuery that begins the transaction as o
// asks and raises synchronous_commit for it, in one round trip.
func TxOptions(o pgx.TxOptions) pgx.TxOptions {
	if o.BeginQuery == "" {
		o.BeginQuery = beginSQL(o)
	}
	o.BeginQuery += "; " + SetLocalSQL
	return o
}

func beginSQL(o pgx.TxOptions) string {
	var b strings.Builder
	b.WriteString("BEGIN")
	if o.IsoLevel != "" {
		b.WriteString(" ISOLATION LEVEL " + string(o.IsoLevel))
	}
	if o.AccessMode != "" {
		b.WriteString(" " + string(o.AccessMode))
	}
	if o.DeferrableMode != "" {
		b.WriteString(" " + string(o.DeferrableMode))
	}
	return b.String()
}

// Beginner is what Begin needs: a *pgxpool.Pool, a *pgx.Conn or a
// *pgxpool.Conn.
type Beginner interface {
	BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error)
}

// Begin begins a durable transaction with options o (see TxOptions).
func Begin(ctx context.Context, b Beginner, o pgx.TxOptions) (pgx.Tx, error) {
	return b.BeginTx(ctx, TxOptions(o))
}

// InTx runs fn in a durable transaction with options o (Begin) and commits
// it when fn returns nil; otherwise, or when ctx ends first, it rolls back.
func InTx(ctx context.Context, b Beginner, o pgx.TxOptions, fn func(pgx.Tx) error) error {
	tx, err := Begin(ctx, b, o)
	if err != nil {
		return err
	}
	// A cancelled ctx does not roll a pgx transaction back by itself.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// ConfigurePool makes every connection of the pool raise synchronous_commit
// to on for its session when it is made, keeping an AfterConnect already
// set (run first).
func ConfigurePool(cfg *pgxpool.Config) {
	prev := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if prev != nil {
			if err := prev(ctx, conn); err != nil {
				return err
			}
		}
		_, err := conn.Exec(ctx, setSessionSQL)
		return err
	}
}
