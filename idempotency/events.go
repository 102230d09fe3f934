package idempotency

import (
	"context"
	"fmt"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/internal/intents"
)

// Actions of the history events (intent_events) the adapter runtime writes.
const (
	// EventOutcomeNotRecorded: an attempt's outcome could not be recorded on
	// its intent because the intent already had a final status (an
	// operator's cancel, or another path recorded first); the note says
	// which outcome was dropped.
	EventOutcomeNotRecorded = "outcome_not_recorded"
	// EventEffectAfterLostOwnership: an attempt performed the effect after
	// it had lost its idempotency key (its lock expired and another attempt
	// took over).
	EventEffectAfterLostOwnership = "effect_after_lost_ownership"
	// EventWaitingForProof: a lookup found nothing while a negative lookup
	// is not yet proof; the intent waits (see the note for until when).
	EventWaitingForProof = "waiting_for_proof"
)

// EventActor is the actor of the history events the adapter runtime writes
// (intent_events.actor; operators' events carry their API token's name).
const EventActor = "adapter-runtime"

// maxEventNote is intent_events.note's limit, in bytes.
const maxEventNote = 4096

// insertEvent appends an event to the intent's history, with the intent's
// current status as both from and to (the event records something that
// happened to the intent without changing its status) and its current
// last_error.
func (s *Store) insertEvent(ctx context.Context, tx pgx.Tx, intentID int64, action, note string) error {
	if len(note) > maxEventNote {
		note = truncateUTF8(note, maxEventNote-len("…")) + "…"
	}
	_, err := tx.Exec(ctx, s.schema.SQL(`
		INSERT INTO fencegate.intent_events (intent_id, actor, action, from_status, to_status, note, last_error)
		SELECT intent_id, $2, $3, status, status, $4, last_error FROM fencegate.intents WHERE intent_id = $1`),
		intentID, EventActor, action, intents.NullString(note))
	if err != nil {
		return fmt.Errorf("record %s event of intent %d: %w", action, intentID, err)
	}
	return nil
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// RecordEvent appends an event (action, note) to the intent's history,
// leaving its status as it is. A missing intent is not an error (it may have
// been swept): nothing is written.
func (s *Store) RecordEvent(ctx context.Context, intentID int64, action, note string) error {
	if intentID < 1 {
		return invalid("intent_id", "must be at least 1, got %d", intentID)
	}
	if err := checkName("action", action, 64); err != nil {
		return err
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error { return s.insertEvent(ctx, tx, intentID, action, note) })
	if err != nil {
		return fmt.Errorf("idempotency: %w", err)
	}
	return nil
}

// NoteWaiting sets the last_error of an intent without a final status to
// msg and, when that changes it, appends an EventWaitingForProof event with
// msg as its note, in one transaction: a redelivery that waits for the same
// proof again writes nothing. It reports whether it wrote.
func (s *Store) NoteWaiting(ctx context.Context, intentID int64, msg string) (bool, error) {
	if intentID < 1 {
		return false, invalid("intent_id", "must be at least 1, got %d", intentID)
	}
	var wrote bool
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		changed, err := s.intents.NoteLastError(ctx, tx, intentID, msg, terminalStatuses)
		if err != nil {
			return err
		}
		if !changed {
			return nil
		}
		wrote = true
		return s.insertEvent(ctx, tx, intentID, EventWaitingForProof, msg)
	})
	if err != nil {
		return false, fmt.Errorf("idempotency: note waiting on intent %d: %w", intentID, err)
	}
	return wrote, nil
}
