package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/outbox"
)

// BeginRecording is Begin, and for the answers that never execute — Done,
// Conflict, and Busy on a held key — it also records the intent's final
// status in the same transaction, while the key's row is locked: the status
// recorded is the key's state at that instant, never a stale reading of it
// (Begin and a later CompleteIntent are two transactions, and between them
// the key can be swept and started again by another delivery of the same
// intent). Done records the key's status and result; Conflict records
// failed; a held key records unknown. Decision.IntentRecorded says whether
// the intent was updated; when it already had a final status, that status
// stays and the outcome goes into its history (EventOutcomeNotRecorded).
func (s *Store) BeginRecording(ctx context.Context, kind, key, fingerprint string, intentID int64) (Decision, error) {
	return s.BeginRecordingWith(ctx, kind, key, fingerprint, intentID, BeginOptions{})
}

// BeginOptions let a caller recognise a Begin of its own whose answer it
// never got (BeginRecordingWith).
type BeginOptions struct {
	// Nonce is a number the caller chose for this Begin (random, not 0),
	// stored on a key the Begin creates or takes back.
	Nonce int64
	// Unanswered is the Nonce of the caller's previous Begin of the same
	// intent whose answer was lost (an error: it may have committed). A
	// key that Begin created — still started, owned by the intent, no I/O
	// declared (last_io_at), its lock fresh — is taken back at once
	// (Execute) instead of being Busy until its lock expires: the caller
	// never had that Begin's decision, so nothing was executed under it.
	// The key then carries Nonce, which must be a new value: the lost
	// Begin's key is taken back once. 0: none.
	Unanswered int64
}

// BeginRecordingWith is BeginRecording with the caller's BeginOptions.
func (s *Store) BeginRecordingWith(ctx context.Context, kind, key, fingerprint string, intentID int64, o BeginOptions) (Decision, error) {
	if err := checkBegin(kind, key, fingerprint, intentID); err != nil {
		return Decision{}, err
	}
	if s.begins != nil && o.Unanswered == 0 {
		// Group commit: a new key is begun in a shared transaction; any
		// other case (and taking back an unanswered Begin) is decided
		// alone, here.
		d, err := s.begins.Do(ctx, beginCall{kind: kind, key: key, fingerprint: fingerprint, intentID: intentID, nonce: o.Nonce})
		if !errors.Is(err, errAlone) {
			return d, err
		}
	}
	return s.beginAndRecord(ctx, kind, key, fingerprint, intentID, true, o)
}

// ConflictMessage is the last_error BeginRecording records on an intent
// whose key is used by owner with different content.
func ConflictMessage(key string, owner int64) string {
	return fmt.Sprintf("idempotency key %q is used by intent %d with different content; not executed", key, owner)
}

// HeldMessage is the last_error BeginRecording records on an intent whose
// key is held with an unknown outcome of owner's attempt.
func HeldMessage(key string, owner int64) string {
	return fmt.Sprintf("idempotency key %q is held with an unknown outcome (intent %d); resolve that intent", key, owner)
}

// recordUnexecuted records the intent's final status for a decision that
// never executes, in Begin's transaction (the key's row is locked).
func (s *Store) recordUnexecuted(ctx context.Context, tx pgx.Tx, key string, d *Decision, intentID int64) error {
	var err error
	switch {
	case d.Outcome == OutcomeDone:
		d.IntentRecorded, err = s.completeIntent(ctx, tx, intentID, d.Status, d.Result, "", false)
	case d.Outcome == OutcomeConflict:
		d.IntentRecorded, err = s.completeIntent(ctx, tx, intentID, outbox.StatusFailed, nil, ConflictMessage(key, d.OwnerIntentID), false)
	case d.Outcome == OutcomeBusy && d.Held:
		d.IntentRecorded, err = s.completeIntent(ctx, tx, intentID, outbox.StatusUnknown, d.Result, HeldMessage(key, d.OwnerIntentID), false)
	}
	return err
}

// SupersedeUnstarted records an intent as superseded without executing it —
// its resource's epoch moved past the intent's — only while no attempt of it
// has begun (attempts = 0) and it has no final status. It is one UPDATE of
// the intent's row: PostgreSQL re-checks the condition on the row as it is
// once it holds the row's lock, so a Begin that counted an attempt first
// (under the same row lock) makes it match nothing, and a Begin after it is
// refused (the intent is final). It returns the resource's epoch and whether
// the intent was superseded. A stale read of attempts in the caller can
// therefore never record superseded while another delivery of the same
// intent is performing the effect.
func (s *Store) SupersedeUnstarted(ctx context.Context, intentID int64) (current int64, superseded bool, err error) {
	if intentID < 1 {
		return 0, false, invalid("intent_id", "must be at least 1, got %d", intentID)
	}
	current, superseded, err = s.intents.SupersedeUnstarted(ctx, s.pool, intentID, terminalStatuses)
	if err != nil {
		return 0, false, fmt.Errorf("idempotency: supersede intent %d: %w", intentID, err)
	}
	return current, superseded, nil
}

// EndIO records that the attempt owning (kind, key) with token has ended
// its I/O with the destination (its Execute returned): from now on it only
// looks the outcome up. It returns the recorded moment (PostgreSQL's clock).
// If token no longer owns the key, it returns an *OwnershipError.
func (s *Store) EndIO(ctx context.Context, kind, key string, token int64) (time.Time, error) {
	if err := checkKey(kind, key); err != nil {
		return time.Time{}, err
	}
	var at time.Time
	err := s.pool.QueryRow(ctx, s.schema.SQL(`
		UPDATE fencegate.idempotency_keys SET last_io_at = clock_timestamp(), updated_at = now()
		WHERE kind = $1 AND idempotency_key = $2 AND token = $3 AND state = 'started'
		RETURNING last_io_at`), kind, key, token).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, s.ownershipError(ctx, kind, key, token)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("idempotency: end I/O %s/%q: %w", kind, key, err)
	}
	return at, nil
}

// BeginIO is called by the owner of a key it recovered, once a lookup proved
// the effect did not happen, right before it executes: it clears last_io_at
// (I/O may now be in progress, so a takeover measures from its own time)
// and renews the lock to LockTimeout from now. With countAttempt (an owner
// that resumed its key, whose Begin counted no attempt) it also counts an
// attempt on intentID, in the same transaction; it returns the intent's
// attempts (0 without countAttempt). While the intent's next attempt is
// deferred (not_before ahead: an early redelivery of an intent whose
// attempt kept the key for a retry) it counts nothing, changes nothing and
// returns a *DeferredError with the time left: the caller keeps the key
// and comes back then. It must commit before any I/O: a
// takeover either committed first — then this matches nothing and returns
// an *OwnershipError, and the caller must not execute — or it comes after
// and sees the I/O as possibly in progress.
func (s *Store) BeginIO(ctx context.Context, kind, key string, token, intentID int64, countAttempts bool) (int, error) {
	return s.beginIO(ctx, kind, key, token, intentID, countAttempts, false)
}

// BeginIOAfterProof is BeginIO for an owner whose lookup, after the settle
// window, proved that no earlier attempt under the key performed the
// effect: in the same transaction the intent's effect, if marked possible,
// becomes none again.
func (s *Store) BeginIOAfterProof(ctx context.Context, kind, key string, token, intentID int64, countAttempts bool) (int, error) {
	return s.beginIO(ctx, kind, key, token, intentID, countAttempts, true)
}

func (s *Store) beginIO(ctx context.Context, kind, key string, token, intentID int64, countAttempts, proven bool) (int, error) {
	if err := checkKey(kind, key); err != nil {
		return 0, err
	}
	var attempts int
	var lost bool
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, s.schema.SQL(`
			UPDATE fencegate.idempotency_keys
			SET last_io_at = NULL, locked_until = clock_timestamp() + $4::interval, updated_at = now()
			WHERE kind = $1 AND idempotency_key = $2 AND token = $3 AND state = 'started'`),
			kind, key, token, interval(s.cfg.LockTimeout))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			lost = true
			return nil
		}
		if proven {
			if err := s.intents.ProveNoEffect(ctx, tx, intentID); err != nil {
				return err
			}
		}
		if countAttempts {
			attempts, _, err = s.countAttempt(ctx, tx, intentID, false)
		}
		return err
	})
	var ie *IntentTerminalError
	var de *DeferredError
	if errors.As(err, &ie) || errors.As(err, &de) {
		return 0, err
	}
	if err != nil {
		return 0, fmt.Errorf("idempotency: begin I/O %s/%q: %w", kind, key, err)
	}
	if lost {
		return 0, s.ownershipError(ctx, kind, key, token)
	}
	return attempts, nil
}

// Proof is AwaitProof's answer.
type Proof struct {
	// Settled: the settle window has passed since LastIOAt, so a lookup
	// started now that finds nothing proves the effect did not happen.
	Settled bool
	// LastIOAt is the last moment any attempt under the key could have
	// done I/O with the destination (PostgreSQL's clock).
	LastIOAt time.Time
	// TrustedAfter is LastIOAt plus the settle window.
	TrustedAfter time.Time
	// Remaining is how long until TrustedAfter, by PostgreSQL's clock;
	// zero when Settled.
	Remaining time.Duration
	// LockedUntil is the owner's lock after the renewal.
	LockedUntil time.Time
}

// AwaitProof is called by the owner of a key (token) that has ended its I/O
// (EndIO) or recovered it (Recover), before each lookup: it says whether a
// negative lookup started now is proof — whether settle has passed since the
// key's last_io_at, by PostgreSQL's clock — and renews the owner's lock to
// LockTimeout from now (never shortening it), so that no other attempt takes
// the key over while this one waits for proof. Ask before looking up, never
// after: a lookup that ran before the window passed proves nothing even if
// the answer arrives after it. When last_io_at is unset (the owner's I/O was
// never declared over) it is set to now. If token no longer owns the key, it
// returns an *OwnershipError.
func (s *Store) AwaitProof(ctx context.Context, kind, key string, token int64, settle time.Duration) (Proof, error) {
	if err := checkKey(kind, key); err != nil {
		return Proof{}, err
	}
	if settle < 0 {
		return Proof{}, invalid("settle", "must not be negative, got %s", settle)
	}
	var p Proof
	var remaining int64
	err := s.pool.QueryRow(ctx, s.schema.SQL(`
		UPDATE fencegate.idempotency_keys
		SET locked_until = greatest(locked_until, clock_timestamp() + $4::interval),
		    last_io_at = coalesce(last_io_at, clock_timestamp()), updated_at = now()
		WHERE kind = $1 AND idempotency_key = $2 AND token = $3 AND state = 'started'
		RETURNING last_io_at, last_io_at + $5::interval, clock_timestamp() >= last_io_at + $5::interval,
		          (extract(epoch FROM greatest(last_io_at + $5::interval - clock_timestamp(), interval '0')) * 1000000)::bigint,
		          locked_until`),
		kind, key, token, interval(s.cfg.LockTimeout), interval(settle)).Scan(
		&p.LastIOAt, &p.TrustedAfter, &p.Settled, &remaining, &p.LockedUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return Proof{}, s.ownershipError(ctx, kind, key, token)
	}
	if err != nil {
		return Proof{}, fmt.Errorf("idempotency: await proof %s/%q: %w", kind, key, err)
	}
	if !p.Settled {
		p.Remaining = time.Duration(remaining) * time.Microsecond
	}
	return p, nil
}

// CheckOwner reports whether token still owns (kind, key) with a live lock,
// by PostgreSQL's clock: nil if so, an error matching ErrLostOwnership if
// not (taken over, released, completed, or the lock expired — an expired
// lock can be taken over at any moment). One indexed read. An attempt calls
// it right before the irrevocable step of its effect: an attempt that lost
// its key stops there, and one that passes has until its lock expires
// before anyone can take over — the margin for a pause between the check
// and the step.
func (s *Store) CheckOwner(ctx context.Context, kind, key string, token int64) error {
	if err := checkKey(kind, key); err != nil {
		return err
	}
	var (
		state   string
		current int64
		live    bool
		until   *time.Time
	)
	err := s.pool.QueryRow(ctx, s.schema.SQL(`
		SELECT state, token, coalesce(locked_until > clock_timestamp(), false), locked_until
		FROM fencegate.idempotency_keys WHERE kind = $1 AND idempotency_key = $2`), kind, key).Scan(&state, &current, &live, &until)
	if errors.Is(err, pgx.ErrNoRows) {
		return &OwnershipError{Kind: kind, Key: key, Token: token}
	}
	if err != nil {
		return fmt.Errorf("idempotency: check owner %s/%q: %w", kind, key, err)
	}
	if current != token || State(state) != StateStarted {
		return &OwnershipError{Kind: kind, Key: key, Token: token, CurrentToken: current, State: State(state)}
	}
	if !live {
		return fmt.Errorf("idempotency key %s/%q: attempt token %d: %w: its lock expired at %s",
			kind, key, token, ErrLostOwnership, until.UTC().Format(time.RFC3339Nano))
	}
	return nil
}
