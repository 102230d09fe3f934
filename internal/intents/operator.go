package intents

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Operators' actions (admin): retry, cancel, resolve. Each runs in the
// action's transaction after it locked the intent's row (and, before it,
// the idempotency key's: Lock order in the package doc), which made the
// status check and this update one atomic step.

// Retry puts intent id back in the dispatcher's queue as if new: pending,
// no claim, no relay, no outcome. last_error is cleared here (the action's
// event keeps it).
func (t Table) Retry(ctx context.Context, tx pgx.Tx, id int64) error {
	_, err := tx.Exec(ctx, t.s.SQL(`UPDATE fencegate.intents
			SET status = 'pending', claimed_by = NULL, claim_expires_at = NULL, relayed_at = NULL,
			    completed_at = NULL, result = NULL, last_error = NULL, not_before = NULL, updated_at = now()
			WHERE intent_id = $1`), id)
	return err
}

// Cancel cancels intent id and drops any claim on it.
func (t Table) Cancel(ctx context.Context, tx pgx.Tx, id int64) error {
	_, err := tx.Exec(ctx, t.s.SQL(`UPDATE fencegate.intents
			SET status = 'cancelled', claimed_by = NULL, claim_expires_at = NULL, not_before = NULL,
			    completed_at = now(), updated_at = now()
			WHERE intent_id = $1`), id)
	return err
}

// Resolve records the outcome status an operator established for intent id,
// with lastError (nil: NULL). Resolved succeeded, its effect is done; resolved
// failed, its effect stays what it was: the gateway cannot know more than
// its attempts showed, and a later retry of an effect that may have happened
// still needs the operator's explicit force.
func (t Table) Resolve(ctx context.Context, tx pgx.Tx, id int64, status string, lastError *string) error {
	_, err := tx.Exec(ctx, t.s.SQL(`UPDATE fencegate.intents
			SET status = $2, last_error = $3, completed_at = now(), updated_at = now(), not_before = NULL,
			    effect = CASE WHEN $2 = 'succeeded' THEN 'done' ELSE effect END
			WHERE intent_id = $1`), id, status, lastError)
	return err
}

// Retention (outbox.Sweeper).

// SweepSQL deletes at most $2 intents completed (succeeded, failed,
// superseded or cancelled) before now() - $1 µs. Unknown intents wait for
// an operator and are never deleted automatically.
//
// FOR UPDATE SKIP LOCKED: rows are locked by the statement that deletes
// them, so none changes between being chosen and being deleted, and a row
// someone else holds right now (an operator's update, an adapter recording
// an outcome again) is skipped for the next sweep instead of making the
// sweep wait — and it waits for nobody. The batch bounds how many row locks
// one statement holds and for how long. Exported for the outbox's plan
// test.
//
// The intents' attempts (intent_attempts, which has no foreign key) go in
// the same statement; their events by the foreign key's cascade.
const SweepSQL = `
WITH gone AS (
	DELETE FROM fencegate.intents WHERE intent_id IN (
		SELECT intent_id FROM fencegate.intents
		WHERE status IN ('succeeded', 'failed', 'superseded', 'cancelled')
		  AND completed_at < now() - $1 * interval '1 microsecond'
		LIMIT $2
		FOR UPDATE SKIP LOCKED)
	RETURNING intent_id
), attempts AS (
	DELETE FROM fencegate.intent_attempts WHERE intent_id IN (SELECT intent_id FROM gone)
)
SELECT count(*) FROM gone`

// Sweep deletes at most batch intents completed more than maxAge ago, with
// their history, and returns how many it deleted.
func (t Table) Sweep(ctx context.Context, q Querier, maxAge time.Duration, batch int) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, t.s.SQL(SweepSQL), maxAge.Microseconds(), batch).Scan(&n)
	return n, err
}

// Parking: tests (adapters/adaptertest) and the dev demo hold an intent back
// from the dispatchers under a claim of a dispatcher that does not exist.

// Park claims intent id for by, a dispatcher that does not exist, for d: no
// dispatcher relays it until Unpark or the claim expires. Park in the
// enqueuing transaction, so no dispatcher can claim it first.
func (t Table) Park(ctx context.Context, q Querier, id int64, by string, d time.Duration) error {
	_, err := q.Exec(ctx, t.s.SQL(`UPDATE fencegate.intents SET claimed_by = $2, claim_expires_at = now() + $3 * interval '1 microsecond' WHERE intent_id = $1`),
		id, by, d.Microseconds())
	return err
}

// Unpark drops the claim on intent id, parked or not. The dispatchers find
// it at their next poll, or at once after a pg_notify('fencegate_intents').
func (t Table) Unpark(ctx context.Context, q Querier, id int64) error {
	_, err := q.Exec(ctx, t.s.SQL(`UPDATE fencegate.intents SET claimed_by = NULL, claim_expires_at = NULL WHERE intent_id = $1`), id)
	return err
}

// Backdate makes intent id relayed with relayed_at age ago and no outcome,
// as after a lost message, so a dispatcher relays it again once age exceeds
// its relay timeout; only while no dispatcher claims it and it was relayed
// before (a dispatcher's mark would set relayed_at to now again). It
// reports whether it did.
func (t Table) Backdate(ctx context.Context, q Querier, id int64, age time.Duration) (bool, error) {
	tag, err := q.Exec(ctx, t.s.SQL(`
			UPDATE fencegate.intents SET status = 'relayed', relayed_at = now() - $2 * interval '1 microsecond', completed_at = NULL
			WHERE intent_id = $1 AND claimed_by IS NULL AND relay_count > 0`), id, age.Microseconds())
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}
