// Package intents owns every SQL statement that changes the intents table:
// the dispatcher's claim, mark and release, the idempotency store's attempt
// count and outcomes, the runtime's last error, the operators' retry,
// cancel and resolve, the outbox sweep, and the test and demo support that
// parks an intent. Callers keep their logic (retries, decisions, errors);
// the statements, and why each is written as it is, live here. A test
// (writers_test.go) fails when a statement that changes intents appears
// anywhere else in the module.
//
// Inserts are the exception: an intent is created only by the SQL functions
// fencegate_enqueue and fencegate_enqueue_batch (migrations), which check
// the epoch under the resource's row lock in the same statement; the outbox
// package calls them and writes no INSERT of its own.
//
// Most functions take a [Querier] (a pgx.Tx, a *pgxpool.Pool, a *pgx.Conn);
// the group commit's statements are queued into the caller's pgx.Batch
// ([QueueComplete]) or composed into its statement ([CountAttemptsCTE]), so
// its round trips stay what they are.
//
// # Lock order
//
// Every transaction that locks more than one row takes them in this order,
// so no two of them deadlock:
//
//  1. the resource's row (resources), by the enqueue functions only, before
//     the intent they insert;
//  2. idempotency keys (idempotency_keys) before intents: the idempotency
//     store's Begin and Complete, alone or in a shared group-commit
//     transaction, and an operator's action lock the key row, then the
//     intent row. Several keys are locked kind by kind, each kind's keys
//     sorted bytewise (COLLATE "C");
//  3. several intents rows in intent_id order. A statement that writes more
//     than one intent first locks them in a CTE, SELECT … ORDER BY intent_id
//     FOR UPDATE (the ORDER BY sits below the lock in the plan), and only
//     then writes them. A plain "UPDATE … WHERE intent_id = ANY($1)" locks
//     in the order its plan visits the rows — a bitmap heap scan visits them
//     in physical order — and deadlocked the dispatcher's mark with the
//     adapters' shared transactions, which race with it (an adapter may
//     settle an intent before its mark): PostgreSQL aborted one side after
//     deadlock_timeout, a second's stall (adapters' test
//     TestGroupCommitNoDeadlockWithRelay).
//
// Statements that must never wait — the dispatcher's claim and the sweep —
// take their rows FOR UPDATE SKIP LOCKED: a row someone else holds is
// skipped, so they wait for nobody and nobody waits for them beyond their
// own short statement.
//
// A single-row UPDATE locks its row for the rest of its transaction; that
// lock is what orders an attempt's count with an operator's cancel, and an
// outcome with the retry that resets the intent.
package intents

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencegate/fencegate/internal/pgschema"
)

// Table is the intents table of one schema: its statements are methods of
// Table, their SQL qualified for the schema (pgschema). The zero value is
// the default schema's.
type Table struct{ s pgschema.Schema }

// In returns the intents table of schema s.
func In(s pgschema.Schema) Table { return Table{s: s} }

// Querier runs statements: a pgx.Tx, a *pgxpool.Pool, a *pgx.Conn or a
// *pgxpool.Conn.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
