package intents

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The dispatcher's statements: claim, mark relayed, release written claims.

// Claimer claims batches of intents for a dispatcher. Make it with
// NewClaimer; the zero value is not usable.
type Claimer struct {
	sql string
}

// NewClaimer returns a Claimer taking up to batchSize intents a claim.
// batchSize must be at least 1 (the dispatcher's validated BatchSize).
func (t Table) NewClaimer(batchSize int) Claimer {
	// BatchSize is a validated int: formatting it into the statement is
	// safe.
	return Claimer{sql: t.s.SQL(fmt.Sprintf(claimSQLFormat, batchSize))}
}

// ProbePlans are the SET LOCAL statements (for a BEGIN) of a transaction
// whose statements all reach their rows by key, and so must always be
// probes of an index: scans that are not (sequential, bitmap, hash and
// merge joins) are ruled out — only where no index path exists does the
// planner still choose one — and the generic plan is kept
// (force_generic_plan), so each statement is planned once per connection
// whatever the tables' statistics say. The planner otherwise chose, on
// statistics older or stranger than the table, plans that read what the
// statement did not need and grew with the table (the shared Begin's and
// Complete's, the claim's: docs/performance.md).
const ProbePlans = "SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; " +
	"SET LOCAL enable_bitmapscan = off; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off"

// ClaimTxBegin begins a claim's transaction, in which the claim and the
// mark run; claimTTL is the dispatcher's ClaimTTL (the idle timeout: see
// the dispatcher's claim). Both are planned with ProbePlans. Without
// them, on a table whose statistics show few pending intents (any table
// that settles what it relays), the planner costed the pending scan as a
// bitmap scan of intents_pending_idx and a sort, cheaper than the ordered
// index scan. A bitmap scan visits every heap row the partial index
// names, dead versions included (every intent relayed since the table's
// last vacuum), and never marks a dead entry as such, so every claim paid
// for all of them again: up to 3.4 ms a claim at a steady 500 /s. The
// ordered index scan stops at the first live pending rows and marks the
// dead entries it passes, which the next claim skips without reading the
// heap. TestClaimPlansProbeAndAreKept (dispatcher) checks the statements
// the dispatcher runs in this transaction.
func ClaimTxBegin(claimTTL time.Duration) string {
	// A whole number of milliseconds is safe to format into the statement.
	return fmt.Sprintf(`BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off; SET LOCAL idle_in_transaction_session_timeout = %d; `,
		max(claimTTL.Milliseconds(), 1)) + ProbePlans
}

// claimSQLFormat claims up to BatchSize (the %[1]d) intents by locking
// their rows in the caller's transaction: first relayed intents whose relay
// timed out ($1 µs) with no outcome — and, for a deferred retry (not_before,
// a destination's Retry-After or the runtime's backoff), whose retry has
// been due for as long: its message waits in the stream until then, and
// relaying it again earlier would execute it before the destination asked
// to be called again — then pending intents in id order from $2 on (see the
// dispatcher's claimLoop cursor; 0 looks at every pending intent).
//
// The claim is the row lock, held until the dispatcher's transaction ends
// with the mark (MarkRelayed) after the PubAcks: nothing is written to
// claim. FOR UPDATE SKIP LOCKED lets two dispatchers claim at once without
// waiting on each other's rows, and never both the same row. A dispatcher
// that dies loses its session and with it its locks, at once; one that
// hangs is cut off by the transaction's idle timeout (the dispatcher's
// ClaimTTL). Either way its intents are claimed again with the same
// relay_count, hence the same message ids, which the stream's duplicate
// window absorbs. Rows claimed in writing (claimed_by, claim_expires_at)
// are still honoured until they expire: a parked intent (Park) is one.
//
// Re-relays leave out the kinds in $3: kinds whose adapters' consumers
// still hold messages not yet delivered or not yet acked (the
// dispatcher's stream check). A relayed intent of such a kind may be one
// of those messages, waiting its turn behind a backlog; relaying it again
// would only queue a second message for the same consumer.
//
// There is no high-water mark: a pending intent is found by its status, so a
// transaction that commits a lower id after a higher one was relayed is
// still picked up by a claim that starts from 0.
//
// The batch size is a literal, not a parameter, on purpose: with a
// computed limit the planner cannot know how many rows come out of the
// CTEs, guesses a tenth of the table, and joins them to intents with a
// hash join over a sequential scan of the whole table (docs/performance.md).
// With literal limits, and the claim's transaction's settings
// (ClaimTxBegin) ruling out bitmap and sequential scans, each CTE is an
// ordered index scan whatever the table's size and statistics. The outer
// LIMIT takes re-relays first and tops up with pending intents; the CTEs
// are read lazily, so the pending scan stops (and locks nothing
// more) once the batch is full.
const claimSQLFormat = `
WITH stale AS (
	SELECT intent_id, resource_id, epoch, kind, idempotency_key, fence, payload::text AS payload,
		relay_count, true AS rerelay, created_at, trace_context::text AS trace_context
	FROM fencegate.intents
	WHERE status = 'relayed'
	  AND relayed_at < now() - $1 * interval '1 microsecond'
	  AND (not_before IS NULL OR not_before < now() - $1 * interval '1 microsecond')
	  AND (claim_expires_at IS NULL OR claim_expires_at < now())
	  AND kind <> ALL($3::text[])
	ORDER BY relayed_at
	LIMIT %[1]d
	FOR UPDATE SKIP LOCKED
), pending AS (
	SELECT intent_id, resource_id, epoch, kind, idempotency_key, fence, payload::text AS payload,
		relay_count, false AS rerelay, created_at, trace_context::text AS trace_context
	FROM fencegate.intents
	WHERE status = 'pending'
	  AND intent_id > $2
	  AND (claim_expires_at IS NULL OR claim_expires_at < now())
	ORDER BY intent_id
	LIMIT %[1]d
	FOR UPDATE SKIP LOCKED
)
SELECT * FROM stale UNION ALL SELECT * FROM pending LIMIT %[1]d`

// Claim claims, in tx, intents relayed longer than relayTimeout ago
// without an outcome, then pending intents with ids above after, by
// locking their rows until tx ends. The rows are intent_id, resource_id,
// epoch, kind, idempotency_key, fence, payload (text), relay_count, whether
// it is a re-relay (bool), created_at and trace_context (text, NULL when
// absent), in no particular order. held says which kinds' relayed intents
// are not re-relayed now (their messages may still wait in the stream).
func (c Claimer) Claim(ctx context.Context, tx pgx.Tx, relayTimeout time.Duration, after int64, held HeldKinds) (pgx.Rows, error) {
	kinds := held.Kinds
	if kinds == nil {
		kinds = []string{}
	}
	return tx.Query(ctx, c.sql, relayTimeout.Microseconds(), after, kinds)
}

// HeldKinds are the kinds whose re-relays wait (Claim).
type HeldKinds struct {
	Kinds []string
}

// markRelayedSQL marks acknowledged intents relayed, in the transaction
// that claimed them: the rows are locked already, by this transaction, so
// the order in which this statement visits them cannot deadlock, and no
// one else can have written them since the claim read them (an adapter's
// outcome waits for the lock). relay_count counts the relay; a written
// claim (an expired one, which the claim passed) is cleared. A terminal
// status is kept, as a second belt.
//
// The mark need not be durable at its commit (the dispatcher commits it
// with synchronous_commit off, so an adapter waiting for the lock is not
// held up by a flush): a mark lost in a crash leaves the intent pending with
// its relay_count, so it is published again under the same message id.
// Nothing that depends on it can survive it: the WAL is flushed in order,
// and the adapter's Begin, which must come before any effect, commits
// durably after the mark it waited for.
const markRelayedSQL = `
UPDATE fencegate.intents SET
	status = CASE WHEN status IN ('pending', 'relayed') THEN 'relayed' ELSE status END,
	relayed_at = CASE WHEN status IN ('pending', 'relayed') THEN now() ELSE relayed_at END,
	relay_count = relay_count + 1,
	claimed_by = NULL, claim_expires_at = NULL, updated_at = now()
WHERE intent_id = ANY($1)`

// MarkRelayed marks the intents ids, claimed in tx, relayed (keeping a
// final status), counts the relay and clears any written claim. The caller
// commits tx. It returns how many it marked.
func (t Table) MarkRelayed(ctx context.Context, tx pgx.Tx, ids []int64) (int64, error) {
	tag, err := tx.Exec(ctx, t.s.SQL(markRelayedSQL), ids)
	return tag.RowsAffected(), err
}

// releaseAllSQL returns every written claim of dispatcher $1 (a dispatcher
// claims by row locks, which end with its transactions; a written claim
// under its id is one an operator's tool or a test parked, or one left by
// an earlier version). Only pending and relayed intents are ever claimed,
// and the status predicates let PostgreSQL find them through the small
// partial indexes instead of scanning the table. Rows are locked in id
// order before any is written (Lock order in the package doc).
const releaseAllSQL = `
WITH l AS (
	SELECT intent_id FROM fencegate.intents WHERE claimed_by = $1 AND (status = 'pending' OR status = 'relayed')
	ORDER BY intent_id
	FOR UPDATE
)
UPDATE fencegate.intents i SET claimed_by = NULL, claim_expires_at = NULL
FROM l
WHERE i.intent_id = l.intent_id AND i.claimed_by = $1`

// ReleaseAll returns every claim of dispatcher by and returns how many it
// returned.
func (t Table) ReleaseAll(ctx context.Context, q Querier, by string) (int64, error) {
	tag, err := q.Exec(ctx, t.s.SQL(releaseAllSQL), by)
	return tag.RowsAffected(), err
}
