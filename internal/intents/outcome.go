package intents

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// The idempotency store's and the adapter runtime's statements: attempts,
// outcomes, last errors. final is the list of final (terminal) statuses,
// after which nothing changes an intent automatically; the callers pass the
// list derived from outbox.Status.Terminal, so the two never disagree.

// CountAttempt increments the attempts of intent id, only while it has no
// final status, and returns the new count; ok is false when no row matched
// (the intent has a final status or does not exist). The UPDATE locks the
// intent's row, so it is ordered with an operator's cancel: either the
// cancel committed first and it matches nothing, or the cancel waits for
// the caller's transaction and then sees the attempt.
//
// possible marks the intent's effect possible (a takeover of an abandoned
// attempt, which may have performed it) in the same statement. effect is the
// intent's effect after the statement.
func (t Table) CountAttempt(ctx context.Context, tx pgx.Tx, id int64, final []string, possible bool) (attempts int, effect string, ok bool, err error) {
	err = tx.QueryRow(ctx, t.s.SQL(`
		UPDATE fencegate.intents SET attempts = attempts + 1,
		    effect = CASE WHEN $3 AND effect = 'none' THEN 'possible' ELSE effect END, updated_at = now()
		WHERE intent_id = $1 AND status <> ALL($2::text[]) AND `+NotDeferred+`
		RETURNING attempts, effect`), id, final, possible).Scan(&attempts, &effect)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", false, nil
	}
	return attempts, effect, err == nil, err
}

// NotDeferred is the condition under which an intent may take an attempt
// now: no retry of it is deferred past this moment (not_before, written by
// a retryable error's Retry-After or backoff in the same write that gave
// its key back). Checked on the intent's row under its lock, in the
// transaction that counts the attempt: a delivery that read the intent
// before the deferral was written, and reaches Begin after it, finds the
// key free but may not execute (TestRetryAfterHoldsForADeliveryThatReadBeforeIt).
const NotDeferred = `(not_before IS NULL OR not_before <= clock_timestamp())`

// CountAttemptsCTE is the intents half of the group commit's Begin
// statement (idempotency/group.go), composed into it: the CTEs l and upd,
// to follow a data-modifying CTE named ins that returns owner_intent_id;
// $6 is the final statuses. It counts an attempt on each intent of ins
// without a final status and not deferred (NotDeferred), locked in id
// order: the sort below FOR UPDATE consumes all of ins before the first
// intent is locked, so every key is taken before any intent (Lock order
// in the package doc). The lock orders
// the count with an operator's cancel, as CountAttempt does. upd returns
// intent_id and attempts.
const CountAttemptsCTE = `l AS (
				SELECT intent_id FROM fencegate.intents
				WHERE intent_id IN (SELECT owner_intent_id FROM ins) AND status <> ALL($6::text[]) AND ` + NotDeferred + `
				ORDER BY intent_id
				FOR UPDATE
			), upd AS (
				UPDATE fencegate.intents i SET attempts = i.attempts + 1, updated_at = now()
				FROM l WHERE i.intent_id = l.intent_id
				RETURNING i.intent_id, i.attempts, i.effect
			)`

// Complete sets the outcome of intent id (status, result, last error,
// completed_at, effect) only while it has no final status, and reports
// whether it did. A final status is never overwritten: an operator's
// cancel, or the outcome another path recorded first, stays. An empty
// result or errMsg is stored as NULL. proven says a lookup after the settle
// window proved that no attempt under the intent's key performed the
// effect: an effect marked possible becomes none. An intent whose effect is
// possible is never recorded failed: it becomes unknown (held for an
// operator) — a second belt under the runtime's own rule.
func (t Table) Complete(ctx context.Context, tx pgx.Tx, id int64, status string, result json.RawMessage, errMsg string, final []string, proven bool) (bool, error) {
	tag, err := tx.Exec(ctx, t.s.SQL(`
		UPDATE fencegate.intents
		SET status = `+statusAfter("$2", "effect")+`, result = $3::jsonb, last_error = $4, completed_at = now(), updated_at = now(),
		    effect = `+effectAfter("$2", "CASE WHEN $6 AND effect = 'possible' THEN 'none' ELSE effect END")+`, not_before = NULL
		WHERE intent_id = $1 AND status <> ALL($5::text[])`),
		id, status, NullJSON(result), NullString(errMsg), final, proven)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// QueueComplete queues into b, the group commit's pipelined batch, the
// outcomes of the intents ids (parallel slices; nil result and errs are
// NULL). The caller has locked the intents in id order in the same
// transaction, after their keys, and checked that none has a final status:
// this statement writes them without looking again.
func (t Table) QueueComplete(b *pgx.Batch, ids []int64, statuses []string, results, errs []*string) {
	b.Queue(t.s.SQL(`
				UPDATE fencegate.intents i
				SET status = `+statusAfter("t.status", "i.effect")+`, result = t.result::jsonb, last_error = t.err, completed_at = now(), updated_at = now(),
				    effect = `+effectAfter("t.status", "i.effect")+`, not_before = NULL
				FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS t(id, status, result, err)
				WHERE i.intent_id = ANY($1) AND i.intent_id = t.id`),
		ids, statuses, results, errs)
}

// SupersedeUnstarted records intent id as superseded without executing it —
// its resource's epoch moved past the intent's — only while no attempt of it
// has begun (attempts = 0) and it has no final status, and returns the
// resource's epoch; ok is false when it did not. It is one UPDATE of the
// intent's row: PostgreSQL re-checks the condition on the row as it is once
// it holds the row's lock, so a Begin that counted an attempt first (under
// the same row lock) makes it match nothing, and a Begin after it is
// refused (the intent is final).
func (t Table) SupersedeUnstarted(ctx context.Context, q Querier, id int64, final []string) (current int64, ok bool, err error) {
	err = q.QueryRow(ctx, t.s.SQL(`
		UPDATE fencegate.intents i
		SET status = 'superseded',
		    result = jsonb_build_object('superseded_by_epoch', r.epoch, 'fenced_at', 'execute'),
		    last_error = NULL, completed_at = now(), updated_at = now()
		FROM fencegate.resources r
		WHERE i.intent_id = $1 AND r.resource_id = i.resource_id
		  AND i.attempts = 0 AND i.status <> ALL($2::text[]) AND r.epoch > i.epoch
		RETURNING r.epoch`), id, final).Scan(&current)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return current, err == nil, err
}

// NoteLastError sets the last_error of intent id to msg while it has no
// final status and msg changes it, and reports whether it did: a
// redelivery that notes the same message again writes nothing.
//
// It is the note of an intent waiting for proof (a lookup found nothing
// yet): its effect may have happened, and is marked possible with it.
func (t Table) NoteLastError(ctx context.Context, q Querier, id int64, msg string, final []string) (bool, error) {
	tag, err := q.Exec(ctx, t.s.SQL(`
			UPDATE fencegate.intents SET last_error = $2, updated_at = now(),
			    effect = CASE WHEN effect = 'none' THEN 'possible' ELSE effect END
			WHERE intent_id = $1 AND status <> ALL($3::text[]) AND last_error IS DISTINCT FROM $2`),
		id, msg, final)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() > 0, nil
}

// statusAfter is the SQL expression of the status recorded for status (an
// SQL expression) on an intent whose effect is the column expression col:
// failed becomes unknown where the effect is possible.
func statusAfter(status, col string) string {
	return `CASE WHEN ` + status + ` = 'failed' AND ` + col + ` = 'possible' THEN 'unknown' ELSE ` + status + ` END`
}

// effectAfter is the SQL expression of an intent's effect once status (an
// SQL expression) is recorded on it, its effect before being the column
// expression col: a success is an effect done, an unknown outcome one that
// may have happened; any other outcome (failed, superseded, cancelled)
// leaves it as it was — it never turns "possible" back into "none".
func effectAfter(status, col string) string {
	return `CASE WHEN ` + status + ` = 'succeeded' THEN 'done' WHEN ` + status + ` = 'unknown' AND ` + col + ` = 'none' THEN 'possible' ELSE ` + col + ` END`
}

// Defer notes a deferred retry of intent id while it has no final status:
// last_error msg, and not_before now()+delay (PostgreSQL's clock), in one
// write, so that the dispatcher's re-relay never brings the intent back
// before the retry is due (a destination's Retry-After, the runtime's
// backoff). possible marks the intent's effect possible (an attempt whose
// outcome is unknown); proven marks it none again (a lookup after the
// settle window proved that no attempt under its key performed it). It
// reports whether the intent was updated.
func (t Table) Defer(ctx context.Context, q Querier, id int64, msg string, delay time.Duration, possible, proven bool, final []string) (bool, error) {
	tag, err := q.Exec(ctx, t.s.SQL(`
		UPDATE fencegate.intents SET last_error = $2, not_before = now() + $3 * interval '1 microsecond',
		    effect = CASE WHEN $4 AND effect = 'none' THEN 'possible' WHEN $5 AND effect = 'possible' THEN 'none' ELSE effect END,
		    updated_at = now()
		WHERE intent_id = $1 AND status <> ALL($6::text[])`), id, msg, delay.Microseconds(), possible, proven, final)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// ProveNoEffect marks the effect of intent id none again where it was
// possible: a lookup after the settle window proved that no attempt under
// its key performed it.
func (t Table) ProveNoEffect(ctx context.Context, q Querier, id int64) error {
	_, err := q.Exec(ctx, t.s.SQL(`UPDATE fencegate.intents SET effect = 'none', updated_at = now() WHERE intent_id = $1 AND effect = 'possible'`), id)
	return err
}

// NullJSON is r as a jsonb parameter: SQL NULL when empty.
func NullJSON(r json.RawMessage) any {
	if len(r) == 0 {
		return nil
	}
	return string(r)
}

// NullString is s as a text parameter: SQL NULL when empty.
func NullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Locked is an intent's row as a locking read returns it.
type Locked struct {
	Status    string
	LastError *string
	Attempts  int
	// Effect is none, possible or done (see the intents table's effect).
	Effect string
}

// Lock locks intent id's row (FOR UPDATE) and returns its status, last
// error and attempts; ok is false when there is no such intent. Take it
// after the key's lock, as every writer does (the package's lock order).
func (t Table) Lock(ctx context.Context, tx pgx.Tx, id int64) (l Locked, ok bool, err error) {
	err = tx.QueryRow(ctx, t.s.SQL(`SELECT status, last_error, attempts, effect FROM fencegate.intents WHERE intent_id = $1 FOR UPDATE`), id).
		Scan(&l.Status, &l.LastError, &l.Attempts, &l.Effect)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, nil
	}
	return l, err == nil, err
}

// QueueLockStatuses queues, on b, the locking read of the intents ids, in
// intent_id order (the order every multi-row lock takes, so that two
// batches never wait for each other), calling found with each one's
// status.
func (t Table) QueueLockStatuses(b *pgx.Batch, ids []int64, found func(id int64, status string)) {
	b.Queue(t.s.SQL(`SELECT intent_id, status FROM fencegate.intents WHERE intent_id = ANY($1) ORDER BY intent_id FOR UPDATE`), ids).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var id int64
				var st string
				if err := rows.Scan(&id, &st); err != nil {
					return err
				}
				found(id, st)
			}
			return rows.Err()
		})
}
