package intents

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/internal/durable"
)

// The dispatcher's statements: claim, mark relayed, release.

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

// claimSQLFormat claims up to BatchSize (the %[1]d) intents for dispatcher
// $1 until now()+$3 µs: first relayed intents whose relay timed out ($2 µs)
// with no outcome — and, for a deferred retry (not_before, a destination's
// Retry-After or the runtime's backoff), whose retry has been due for as
// long: its message waits in the stream until then, and relaying it again
// earlier would execute it before the destination asked to be called
// again — then pending intents in id order from $4 on (see the
// dispatcher's claimLoop cursor; 0 looks at every pending intent).
//
// FOR UPDATE SKIP LOCKED lets two dispatchers claim at once without waiting
// on each other's rows, and never both the same row: a row another claim is
// writing is skipped, and once that claim has committed the claim check
// (claim_expires_at absent or past), re-evaluated on the newest row version,
// rejects it. The claim is written into the row rather than held as a lock
// because publishing outlives this statement's transaction; the expiry is
// what hands a crashed dispatcher's claims back to the pool.
//
// Re-relays leave out the kinds in $5: kinds whose adapters' consumers
// still hold messages not yet delivered or not yet acked (the
// dispatcher's stream check). A relayed intent of such a kind may be one
// of those messages, waiting its turn behind a backlog; relaying it again
// would only queue a second message for the same consumer.
//
// There is no high-water mark: a pending intent is found by its status, so a
// transaction that commits a lower id after a higher one was relayed is
// still picked up by a claim that starts from 0.
//
// The batch size is a literal, not a parameter, on purpose: with
// "LIMIT $2 - (SELECT count(*) FROM stale)" the planner cannot know how
// many rows come out of the CTEs, guesses a tenth of the table, and joins
// them to intents with a hash join over a sequential scan of the whole
// table, in every claim (48 ms for 256 rows over 40,000 intents, measured:
// docs/performance.md), a cost that grows with the completed intents kept. With literal limits
// it is a nested loop over the primary key whatever the table's size, with
// custom and generic plans alike. The outer LIMIT takes re-relays first and
// tops up with pending intents; the CTEs are read lazily, so the pending
// scan stops (and locks nothing more) once the batch is full.
const claimSQLFormat = `
WITH stale AS (
	SELECT intent_id FROM fencegate.intents
	WHERE status = 'relayed'
	  AND relayed_at < now() - $2 * interval '1 microsecond'
	  AND (not_before IS NULL OR not_before < now() - $2 * interval '1 microsecond')
	  AND (claim_expires_at IS NULL OR claim_expires_at < now())
	  AND kind <> ALL($5::text[])
	ORDER BY relayed_at
	LIMIT %[1]d
	FOR UPDATE SKIP LOCKED
), pending AS (
	SELECT intent_id FROM fencegate.intents
	WHERE status = 'pending'
	  AND intent_id > $4
	  AND (claim_expires_at IS NULL OR claim_expires_at < now())
	ORDER BY intent_id
	LIMIT %[1]d
	FOR UPDATE SKIP LOCKED
)
UPDATE fencegate.intents i
SET claimed_by = $1, claim_expires_at = now() + $3 * interval '1 microsecond'
FROM (SELECT intent_id FROM stale UNION ALL SELECT intent_id FROM pending LIMIT %[1]d) c
WHERE i.intent_id = c.intent_id
RETURNING i.intent_id, i.resource_id, i.epoch, i.kind, i.idempotency_key, i.fence,
	i.payload::text, i.relay_count, i.status = 'relayed', i.created_at, i.trace_context::text`

// Claim claims for dispatcher by, until now()+claimTTL, intents relayed
// longer than relayTimeout ago without an outcome, then pending intents
// with ids above after. The rows are intent_id, resource_id, epoch, kind,
// idempotency_key, fence, payload (text), relay_count, whether it is a
// re-relay (bool), created_at and trace_context (text, NULL when absent),
// in no particular order. The claim commits with the statement (unless q is
// a transaction). held says which kinds' relayed intents are not re-relayed
// now (their messages may still wait in the stream).
func (c Claimer) Claim(ctx context.Context, q Querier, by string, relayTimeout, claimTTL time.Duration, after int64, held HeldKinds) (pgx.Rows, error) {
	kinds := held.Kinds
	if kinds == nil {
		kinds = []string{}
	}
	return q.Query(ctx, c.sql, by, relayTimeout.Microseconds(), claimTTL.Microseconds(), after, kinds)
}

// HeldKinds are the kinds whose re-relays wait (Claim).
type HeldKinds struct {
	Kinds []string
}

// markRelayedSQL marks acknowledged intents relayed and clears the claim.
// It touches only rows still claimed by us ($2): if our claim expired and
// another dispatcher took the intent meanwhile, this update leaves it alone
// (that dispatcher publishes the same message id, deduplicated by the
// stream, and marks it itself). relay_count cannot have moved under our
// claim: only the claim holder increments it, here. An adapter may have
// recorded an outcome already (it does not look at claims); a terminal
// status is kept.
//
// The rows are locked in intent id order (the CTE's ORDER BY below FOR
// UPDATE) before any is written: see the package doc, Lock order.
const markRelayedSQL = `
WITH l AS (
	SELECT intent_id FROM fencegate.intents WHERE intent_id = ANY($1) AND claimed_by = $2
	ORDER BY intent_id
	FOR UPDATE
)
UPDATE fencegate.intents i SET
	status = CASE WHEN i.status IN ('pending', 'relayed') THEN 'relayed' ELSE i.status END,
	relayed_at = CASE WHEN i.status IN ('pending', 'relayed') THEN now() ELSE i.relayed_at END,
	relay_count = i.relay_count + 1,
	claimed_by = NULL, claim_expires_at = NULL, updated_at = now()
FROM l
WHERE i.intent_id = l.intent_id AND i.claimed_by = $2 AND ` + durable.Where

// MarkRelayed marks the intents ids that dispatcher by still claims relayed
// (keeping a final status an adapter recorded first), counts the relay and
// clears the claim, durably. It returns how many it marked: fewer than
// len(ids) when claims expired meanwhile.
func (t Table) MarkRelayed(ctx context.Context, q Querier, ids []int64, by string) (int64, error) {
	tag, err := q.Exec(ctx, t.s.SQL(markRelayedSQL), ids, by)
	return tag.RowsAffected(), err
}

// releaseSQL returns claims without relaying, locking in id order as
// markRelayedSQL does.
const releaseSQL = `
WITH l AS (
	SELECT intent_id FROM fencegate.intents WHERE intent_id = ANY($1) AND claimed_by = $2
	ORDER BY intent_id
	FOR UPDATE
)
UPDATE fencegate.intents i SET claimed_by = NULL, claim_expires_at = NULL
FROM l
WHERE i.intent_id = l.intent_id AND i.claimed_by = $2`

// Release returns the claims of dispatcher by on ids, without relaying, and
// returns how many it returned.
func (t Table) Release(ctx context.Context, q Querier, ids []int64, by string) (int64, error) {
	tag, err := q.Exec(ctx, t.s.SQL(releaseSQL), ids, by)
	return tag.RowsAffected(), err
}

// releaseAllSQL returns every claim of dispatcher $1. Only pending and
// relayed intents are ever claimed, and the status predicates let PostgreSQL
// find them through the small partial indexes instead of scanning the table.
// Rows are locked in id order, as in markRelayedSQL.
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
