package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Retry is a retry of an intent deferred by the attempt that owns its key:
// what the attempt found (Error, the intent's last_error) and when the
// retry is due (Delay from now, PostgreSQL's clock: the intent's
// not_before). Neither the dispatcher's re-relay nor the runtime executes
// the intent before then.
type Retry struct {
	Kind     string
	Key      string
	Token    int64
	IntentID int64
	Error    string
	Delay    time.Duration
	// Attempt, when set, is recorded in the intent's attempt history in the
	// same transaction.
	Attempt *Attempt
}

// ReleaseForRetry is Release and the deferral of the intent's retry in one
// transaction, for an attempt that definitely did NOT perform the effect
// and whose intent's effect is not possible otherwise: the key is deleted
// (the next attempt Executes afresh) and the intent's last_error and
// not_before are written. proven says a lookup after the settle window
// proved that no attempt under the key performed the effect: an effect
// marked possible becomes none again. One transaction, so that a crash
// never leaves the key released while the retry is not yet deferred (the
// re-relay would execute at once), nor the retry deferred while the key
// is still owned. If token no longer owns the key, it returns an
// *OwnershipError and changes nothing.
func (s *Store) ReleaseForRetry(ctx context.Context, r Retry, proven bool) error {
	if err := checkKey(r.Kind, r.Key); err != nil {
		return err
	}
	var lost bool
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, s.schema.SQL(releaseSQL), r.Kind, r.Key, r.Token)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			lost = true
			return nil
		}
		if _, err = s.intents.Defer(ctx, tx, r.IntentID, r.Error, r.Delay, false, proven, terminalStatuses); err != nil {
			return err
		}
		return s.insertAttempt(ctx, tx, r.IntentID, r.Attempt)
	})
	if err != nil {
		return fmt.Errorf("idempotency: release %s/%q for a retry: %w", r.Kind, r.Key, err)
	}
	if lost {
		return s.ownershipError(ctx, r.Kind, r.Key, r.Token)
	}
	return nil
}

// KeepForRetry defers the intent's retry while its attempt keeps the key:
// for an attempt whose outcome is unknown (possible: the intent's effect
// becomes possible) or one that failed after an earlier attempt's outcome
// was unknown. The key is never released then — that would say nothing
// happened under it. In one transaction it records the end of the
// attempt's I/O (last_io_at), extends the lock to cover the wait (Delay
// plus LockTimeout, so that the intent's own redelivery resumes the key
// before anyone can take it over, and a dead owner's lock still expires),
// and writes the intent's last_error, not_before and effect. If token no
// longer owns the key, it returns an *OwnershipError and changes nothing.
func (s *Store) KeepForRetry(ctx context.Context, r Retry, possible bool) error {
	if err := checkKey(r.Kind, r.Key); err != nil {
		return err
	}
	var lost bool
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, s.schema.SQL(`
			UPDATE fencegate.idempotency_keys
			SET last_io_at = clock_timestamp(),
			    locked_until = greatest(locked_until, clock_timestamp() + $4::interval + $5::interval),
			    updated_at = now()
			WHERE kind = $1 AND idempotency_key = $2 AND token = $3 AND state = 'started'`),
			r.Kind, r.Key, r.Token, interval(r.Delay), interval(s.cfg.LockTimeout))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			lost = true
			return nil
		}
		_, err = s.intents.Defer(ctx, tx, r.IntentID, r.Error, r.Delay, possible, false, terminalStatuses)
		// !ok: the intent has a final status meanwhile (an operator
		// resolved it): nothing to defer. The key stays owned until its
		// lock expires, and the next Begin decides.
		if err != nil {
			return err
		}
		return s.insertAttempt(ctx, tx, r.IntentID, r.Attempt)
	})
	if err != nil {
		var ie *IntentTerminalError
		if errors.As(err, &ie) {
			return err
		}
		return fmt.Errorf("idempotency: keep %s/%q for a retry: %w", r.Kind, r.Key, err)
	}
	if lost {
		return s.ownershipError(ctx, r.Kind, r.Key, r.Token)
	}
	return nil
}
