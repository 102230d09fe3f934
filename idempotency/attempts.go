package idempotency

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Outcomes of an attempt in the intent's attempt history (intent_attempts)
// besides the intent statuses it records (succeeded, failed, unknown,
// superseded).
const (
	// AttemptRetry: the attempt did not perform the effect; the key was
	// given back and the next attempt deferred (not_before).
	AttemptRetry = "retry"
	// AttemptRetryKeyKept: deferred while the key stays owned: the effect
	// may have happened (this attempt's or an earlier one's outcome is
	// unknown).
	AttemptRetryKeyKept = "retry_key_kept"
	// AttemptWaitingForProof: a lookup found nothing while a negative
	// lookup is not yet proof; the intent waits with its key owned.
	AttemptWaitingForProof = "waiting_for_proof"
	// AttemptLookupFailed: the lookup at the destination failed; the
	// intent's redelivery looks up again.
	AttemptLookupFailed = "lookup_failed"
	// AttemptLostKey: the attempt's key was taken over (its lock expired)
	// before it recorded how it ended; the new owner decides.
	AttemptLostKey = "lost_key"
	// AttemptAbandoned: the attempt never recorded an end (its process
	// died or stopped); written by the attempt that took its key over.
	AttemptAbandoned = "abandoned"
)

// Attempt is what one attempt of an intent did, for its attempt history.
// It is recorded in the transaction that records how the attempt ended
// (Completion.Attempt, Retry.Attempt), or alone by RecordAttempt where
// nothing else is written.
type Attempt struct {
	// Number is the intent's attempt number (its attempts count when this
	// attempt was counted).
	Number int
	// Elapsed is how long the attempt ran, measured by its process on the
	// monotonic clock; the row's started_at is the writing transaction's
	// time (PostgreSQL's now()) less Elapsed, so every time in an intent's
	// history is PostgreSQL's.
	Elapsed time.Duration
	// Process names the adapter process that ran it.
	Process string
	// Outcome: an intent status it recorded, or one of the Attempt*
	// constants.
	Outcome string
	// ErrorClass is retryable, permanent, unknown, unclassified or empty;
	// Error its text (truncated to 4 KiB).
	ErrorClass, Error string
	// Lookup is found, not_found, error or empty (no lookup).
	Lookup string
	// RetryAfter is the destination's Retry-After, if it gave one.
	RetryAfter time.Duration
	// Delay: the next attempt is due this long after the write (the
	// intent's not_before); zero: none set.
	Delay time.Duration
	// Token is the idempotency key's token the attempt held.
	Token int64
}

// attemptsSQL inserts attempts given as parallel arrays. ON CONFLICT DO
// NOTHING: a retry of a write whose answer was lost finds its row.
// not_before is computed as the intent's (internal/intents.Defer): now()
// plus the delay, the same transaction's now(). The attempt ends at now()
// too, the time the same transaction gives the intent's completed_at and
// events, so that the intent's timeline reads in order (clock_timestamp(),
// the insert's own time, put the attempt's end, and start, after the
// completion it recorded).
const attemptsSQL = `
	INSERT INTO fencegate.intent_attempts
		(intent_id, attempt, started_at, ended_at, process, outcome, error_class, error, lookup, retry_after, not_before, key_token)
	SELECT t.id, t.n, now() - t.el * interval '1 microsecond', now(), t.proc, t.outcome,
	       t.class, t.err, t.lookup, CASE WHEN t.ra > 0 THEN t.ra * interval '1 microsecond' END,
	       CASE WHEN t.delay > 0 THEN now() + t.delay * interval '1 microsecond' END, t.token
	FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
	            $9::bigint[], $10::bigint[], $11::bigint[])
	     AS t(id, n, el, proc, outcome, class, err, lookup, ra, delay, token)
	ON CONFLICT (intent_id, attempt) DO NOTHING`

// attemptRows collects attempts for attemptsSQL.
type attemptRows struct {
	ids                        []int64
	ns                         []int32
	elapsed, ra, delay, tokens []int64
	procs, outcomes            []*string
	classes, errs, lookups     []*string
}

func (r *attemptRows) add(intentID int64, a *Attempt) {
	if a == nil || a.Number < 1 {
		return
	}
	msg := a.Error
	if len(msg) > maxEventNote {
		msg = truncateUTF8(msg, maxEventNote-len("…")) + "…"
	}
	proc := a.Process
	if len(proc) > 200 {
		proc = truncateUTF8(proc, 200)
	}
	r.ids = append(r.ids, intentID)
	r.ns = append(r.ns, int32(a.Number))
	r.elapsed = append(r.elapsed, max(a.Elapsed, 0).Microseconds())
	r.procs = append(r.procs, textOrNil(proc))
	r.outcomes = append(r.outcomes, &a.Outcome)
	r.classes = append(r.classes, textOrNil(a.ErrorClass))
	r.errs = append(r.errs, textOrNil(msg))
	r.lookups = append(r.lookups, textOrNil(a.Lookup))
	r.ra = append(r.ra, max(a.RetryAfter, 0).Microseconds())
	r.delay = append(r.delay, max(a.Delay, 0).Microseconds())
	r.tokens = append(r.tokens, a.Token)
}

func (r *attemptRows) args() []any {
	return []any{r.ids, r.ns, r.elapsed, r.procs, r.outcomes, r.classes, r.errs, r.lookups, r.ra, r.delay, r.tokens}
}

// insertAttempt records a in tx; nil records nothing.
func (s *Store) insertAttempt(ctx context.Context, tx pgx.Tx, intentID int64, a *Attempt) error {
	var rows attemptRows
	rows.add(intentID, a)
	if len(rows.ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, s.schema.SQL(attemptsSQL), rows.args()...); err != nil {
		return fmt.Errorf("record attempt %d of intent %d: %w", a.Number, intentID, err)
	}
	return nil
}

// RecordAttempt records an attempt of intent intentID that ended without
// another write (a failed lookup, a key lost to a takeover, a wait for
// proof that changed nothing). A missing intent is not an error (it may
// have been swept): nothing is written.
func (s *Store) RecordAttempt(ctx context.Context, intentID int64, a Attempt) error {
	if intentID < 1 {
		return invalid("intent_id", "must be at least 1, got %d", intentID)
	}
	if a.Number < 1 {
		return invalid("attempt", "must be at least 1, got %d", a.Number)
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, s.schema.SQL(`SELECT EXISTS (SELECT 1 FROM fencegate.intents WHERE intent_id = $1)`), intentID).Scan(&exists); err != nil || !exists {
			return err
		}
		return s.insertAttempt(ctx, tx, intentID, &a)
	})
	if err != nil {
		return fmt.Errorf("idempotency: %w", err)
	}
	return nil
}

// recordAbandoned records the attempt that owned a key until a takeover as
// abandoned: the latest attempt of its intent (owner), unless that attempt
// recorded an end. Called before the takeover counts its own attempt, so
// that the owner's latest attempt is still the abandoned one when the
// owner is the taking-over intent itself. It reads the owner's row without
// locking it (intent_attempts has no foreign key), so it adds no lock to
// the lock order of internal/intents.
func (s *Store) recordAbandoned(ctx context.Context, tx pgx.Tx, owner, token int64, by int64) error {
	_, err := tx.Exec(ctx, s.schema.SQL(`
		INSERT INTO fencegate.intent_attempts (intent_id, attempt, ended_at, outcome, error, key_token)
		SELECT intent_id, attempts, clock_timestamp(), 'abandoned', $3, $2
		FROM fencegate.intents WHERE intent_id = $1 AND attempts > 0
		ON CONFLICT (intent_id, attempt) DO NOTHING`),
		owner, token, fmt.Sprintf("its key's lock expired before it recorded how it ended; taken over by an attempt of intent %d", by))
	if err != nil {
		return fmt.Errorf("record abandoned attempt of intent %d: %w", owner, err)
	}
	return nil
}
