package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/durable"
	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/outbox"
)

// Action is an operator's action on an intent.
type Action string

// Actions.
const (
	// ActionRetry: failed or unknown → pending, to be relayed again. An
	// intent whose effect is possible (an attempt's outcome was lost: the
	// effect may have happened) is retried only with Force: the operator
	// accepts a second effect.
	ActionRetry Action = "retry"
	// ActionCancel: pending, failed or unknown → cancelled. A pending
	// intent whose attempt has begun (the adapter took its message before
	// the dispatcher marked it relayed) is in flight and is not cancelled:
	// the effect may be happening; its outcome decides. An intent whose
	// effect is possible is never cancelled: a cancelled intent reads as an
	// effect that did not happen; resolve records what the operator found.
	ActionCancel Action = "cancel"
	// ActionResolve: unknown → succeeded or failed, as the operator found
	// out at the destination.
	ActionResolve Action = "resolve"
)

// allowedFrom lists the statuses each action applies to.
var allowedFrom = map[Action][]outbox.Status{
	ActionRetry:   {outbox.StatusFailed, outbox.StatusUnknown},
	ActionCancel:  {outbox.StatusPending, outbox.StatusFailed, outbox.StatusUnknown},
	ActionResolve: {outbox.StatusUnknown},
}

// AllowedFrom returns the statuses a applies to, in lifecycle order; nil
// for an action that is not retry, cancel or resolve.
func (a Action) AllowedFrom() []outbox.Status { return slices.Clone(allowedFrom[a]) }

// AppliesTo reports whether a applies to intents of status s.
func (a Action) AppliesTo(s outbox.Status) bool { return slices.Contains(allowedFrom[a], s) }

// MaxNoteLen is the longest note on an action, in bytes.
const MaxNoteLen = 4096

// ForcedNote begins the note of the event a forced retry records (a retry
// of an intent whose effect is possible), followed by "; " and the
// operator's note when there is one: the history says that the operator
// accepted a second effect. A forced retry's own note is therefore at most
// MaxNoteLen-len(ForcedNote)-2 bytes.
const ForcedNote = "forced: a second effect accepted"

// ActionRequest asks for one action on one intent.
type ActionRequest struct {
	IntentID int64
	Action   Action
	// Actor is who asks: a token's name, or "anonymous".
	Actor string
	// Outcome is resolve's outcome: succeeded or failed.
	Outcome outbox.Status
	// Note is the operator's reason; optional.
	Note string
	// Force retries an intent whose effect is possible: the operator
	// accepts that the effect may happen twice. Only retry takes it.
	Force bool
}

// Validate checks the request without reading anything: what Apply
// refuses as bad input before it begins, so that a caller can refuse it
// before connecting.
func (r ActionRequest) Validate() error { return r.validate() }

func (r ActionRequest) validate() error {
	if r.IntentID < 1 {
		return inputErr("intent_id", "must be a positive integer")
	}
	if _, ok := allowedFrom[r.Action]; !ok {
		return inputErr("action", "must be retry, cancel or resolve, got %q", r.Action)
	}
	if r.Actor == "" {
		return inputErr("actor", "must not be empty")
	}
	if r.Action == ActionResolve && r.Outcome != outbox.StatusSucceeded && r.Outcome != outbox.StatusFailed {
		return inputErr("outcome", "must be \"succeeded\" or \"failed\", got %q", r.Outcome)
	}
	if r.Action != ActionResolve && r.Outcome != "" {
		return inputErr("outcome", "only resolve takes an outcome")
	}
	if r.Force && r.Action != ActionRetry {
		return inputErr("force", "only retry takes force (accepting a second effect); %s of an intent whose effect may have happened is refused whatever, "+
			"and resolve records what the operator found at the destination", r.Action)
	}
	if len(r.Note) > MaxNoteLen || !utf8.ValidString(r.Note) || containsNUL(r.Note) {
		return inputErr("note", "must be valid UTF-8 without NUL, at most %d bytes", MaxNoteLen)
	}
	if r.Force && len(r.Note) > maxForcedNoteLen {
		return inputErr("note", "must be at most %d bytes with force (the event's note begins with %q)", maxForcedNoteLen, ForcedNote)
	}
	return nil
}

// maxForcedNoteLen is the longest operator's note of a forced retry: its
// event's note is ForcedNote, "; " and it.
const maxForcedNoteLen = MaxNoteLen - len(ForcedNote) - 2

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// InvalidStateError says the intent's status does not allow the action.
// Nothing was changed.
type InvalidStateError struct {
	IntentID int64
	Action   Action
	Status   outbox.Status
	Allowed  []outbox.Status
	// InFlight: the status allows the action, but an attempt of the
	// intent has begun and has no outcome yet, so a cancel now would record
	// a status that may contradict what the attempt does.
	InFlight bool
	// Effect is set (EffectPossible) when the status allows the action
	// but the intent's effect may have happened: a retry without Force, or
	// a cancel.
	Effect outbox.Effect
}

func (e *InvalidStateError) Error() string {
	if e.Effect != "" {
		return fmt.Sprintf("intent %d is %s and its effect is %s: an attempt's outcome was lost, so the effect may have happened; %s",
			e.IntentID, e.Status, e.Effect, e.effectAdvice())
	}
	if e.InFlight {
		return fmt.Sprintf("intent %d is %s but in flight: an attempt has begun and has no outcome yet; "+
			"wait for its outcome, or %s it once it is held unknown or failed", e.IntentID, e.Status, e.Action)
	}
	return fmt.Sprintf("intent %d is %s; %s applies only to %v", e.IntentID, e.Status, e.Action, e.Allowed)
}

// effectAdvice says what the operator can do about an intent whose effect
// is possible, for the refused action and the intent's status. A failed
// intent whose effect is possible was resolved failed by an operator: the
// resolve does not make the effect less possible.
func (e *InvalidStateError) effectAdvice() string {
	const resolve = "find out at the destination and resolve the intent with what you found"
	if e.Action == ActionRetry {
		if e.Status == outbox.StatusUnknown {
			return resolve + ", or retry with force to accept a second effect"
		}
		return "a resolve to failed does not change that: retry with force to accept a second effect"
	}
	advice := "a " + string(e.Action) + " would record that it did not happen, and force does not apply to it: "
	switch e.Status {
	case outbox.StatusUnknown:
		return advice + resolve
	case outbox.StatusPending:
		return advice + "wait for its outcome (should it end unknown, " + resolve + ")"
	}
	return advice + "it stays " + string(e.Status)
}

// KeyChange says what an action did to the intent's idempotency key.
type KeyChange string

// Key changes.
const (
	KeyUntouched KeyChange = ""
	// KeyUnheld: a held key was released so the next attempt looks the
	// outcome up first (Recover).
	KeyUnheld KeyChange = "unheld"
	// KeyDeleted: a key completed as failed, or (a forced retry) a held
	// key, was deleted so the effect can be attempted again.
	KeyDeleted KeyChange = "deleted"
	// KeyCompleted: a held key was completed with the resolved outcome.
	KeyCompleted KeyChange = "completed"
)

// ActionResult is what an action did.
type ActionResult struct {
	IntentID   int64         `json:"intent_id"`
	Action     Action        `json:"action"`
	FromStatus outbox.Status `json:"from_status"`
	Status     outbox.Status `json:"status"`
	EventID    int64         `json:"event_id"`
	Key        KeyChange     `json:"key,omitempty"`
	// Effect is the intent's effect after the action (none, possible,
	// done).
	Effect outbox.Effect `json:"effect"`
	// Forced: a retry of an intent whose effect is possible, with Force
	// (recorded in the event's note, ForcedNote).
	Forced bool `json:"forced,omitempty"`
}

// Apply performs an operator action in one transaction: it locks the
// intent's idempotency key row (if any) and the intent's row, checks the
// status allows the action, changes status and key, and records the event.
// It returns outbox.ErrNotFound for an unknown intent, an
// *InvalidStateError when the status does not allow the action (or, for a
// cancel, when an attempt of the intent is in flight: InFlight; or when its
// effect is possible, for a cancel or a retry without Force: Effect), and
// a *fenceerr.InvalidError for bad requests.
func (o *Operator) Apply(ctx context.Context, req ActionRequest) (ActionResult, error) {
	if err := o.actor(); err != nil {
		return ActionResult{}, err
	}
	if err := req.validate(); err != nil {
		return ActionResult{}, err
	}
	res := ActionResult{IntentID: req.IntentID, Action: req.Action}
	// durable: an operator's action is acknowledged only once it would
	// survive a crash (see internal/durable).
	tx, err := durable.Begin(ctx, o.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return res, fmt.Errorf("operator: %s intent %d: %w", req.Action, req.IntentID, err)
	}
	// A cancelled ctx does not roll a pgx transaction back by itself.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := apply(ctx, tx, o.sch, req, &res); err != nil {
		var ise *InvalidStateError
		if errors.As(err, &ise) || errors.Is(err, outbox.ErrNotFound) {
			return res, err
		}
		return res, fmt.Errorf("operator: %s intent %d: %w", req.Action, req.IntentID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("operator: %s intent %d: commit: %w", req.Action, req.IntentID, err)
	}
	return res, nil
}

// attemptInFlight reports whether an attempt of the intent has begun and
// has no outcome yet: the intent's key, with the intent's content, is
// started, and the intent owns it or has attempted it (a takeover after an
// expired lock moves the ownership to another intent while this one's
// attempt may still be performing the effect). An attempt that ended
// completed the key (succeeded, failed), held it (unknown: the intent is
// then unknown too) or released it (deleted: the effect did not happen), so
// intents.attempts > 0 alone does not make an intent in flight — a retried
// intent has attempts from before and may be cancelled until its next
// attempt begins.
//
// It must run after the intent's row is locked (FOR UPDATE), as its own
// statement: that orders it with an attempt's start. idempotency.Store's
// Begin writes the key and counts the attempt on the intent's row
// (countAttempt, an UPDATE that takes the same row lock) in one
// transaction. Either that transaction committed before we got the lock —
// then this statement, which under READ COMMITTED sees everything committed
// before it started, sees the started key — or it waits for our lock, sees
// the intent cancelled once we commit, is refused and rolls its key back.
// The key is read without a lock: locking it after the intent's row would
// take the two locks in the opposite order to Begin's and could deadlock,
// and a key an attempt is ending right now (Complete, Release) read as still
// started only makes the cancel refused, never an in-flight one allowed.
func attemptInFlight(ctx context.Context, tx pgx.Tx, sch pgschema.Schema, intentID int64, kind, key, fingerprint string, attempts int) (bool, error) {
	var inFlight bool
	err := tx.QueryRow(ctx, sch.SQL(`SELECT EXISTS (SELECT 1 FROM fencegate.idempotency_keys
		WHERE kind = $1 AND idempotency_key = $2 AND fingerprint = $3 AND state = 'started'
		  AND (owner_intent_id = $4 OR $5 > 0))`), kind, key, fingerprint, intentID, attempts).Scan(&inFlight)
	if err != nil {
		return false, fmt.Errorf("look for an attempt in flight: %w", err)
	}
	return inFlight, nil
}

type keyRow struct {
	state       idempotency.State
	fingerprint string
	status      *string
}

func apply(ctx context.Context, tx pgx.Tx, sch pgschema.Schema, req ActionRequest, res *ActionResult) error {
	// kind, key and payload never change after insert, so reading them
	// without a lock is safe; they say which key row to lock.
	var kind, key string
	var payload []byte
	err := tx.QueryRow(ctx, sch.SQL(`SELECT kind, idempotency_key, payload FROM fencegate.intents WHERE intent_id = $1`), req.IntentID).
		Scan(&kind, &key, &payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return outbox.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("read intent: %w", err)
	}

	// Lock the key row before the intent row (the lock order of
	// internal/intents), so an action and an adapter's attempt never
	// deadlock. Holding the key lock also means no attempt can start, take
	// over or complete the key between our look at it and our change to it.
	var k *keyRow
	if req.Action != ActionCancel {
		var row keyRow
		var state string
		err := tx.QueryRow(ctx, sch.SQL(`SELECT state, fingerprint, status FROM fencegate.idempotency_keys
			WHERE kind = $1 AND idempotency_key = $2 FOR UPDATE`), kind, key).Scan(&state, &row.fingerprint, &row.status)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("lock idempotency key: %w", err)
		default:
			row.state = idempotency.State(state)
			// A key with another fingerprint belongs to other content under
			// the same business key: this intent's attempts are conflicts
			// and the key is not ours to change.
			if row.fingerprint == idempotency.Fingerprint(kind, payload) {
				k = &row
			}
		}
	}

	// Lock the intent's row: the status check below and the update are one
	// atomic step, ordered with the dispatcher's and adapters' writes to
	// the row (which all lock it too).
	locked, found, err := intents.In(sch).Lock(ctx, tx, req.IntentID)
	if err != nil {
		return fmt.Errorf("lock intent: %w", err)
	}
	if !found {
		return outbox.ErrNotFound
	}
	status, lastError, attempts := locked.Status, locked.LastError, locked.Attempts
	from, effect := outbox.Status(status), outbox.Effect(locked.Effect)
	res.FromStatus, res.Status, res.Effect = from, from, effect
	if !slices.Contains(allowedFrom[req.Action], from) {
		return &InvalidStateError{IntentID: req.IntentID, Action: req.Action, Status: from, Allowed: allowedFrom[req.Action]}
	}
	// The effect is read under the intent's row lock, which every writer of
	// it takes (an attempt's start, its outcome, a deferred retry), so it
	// cannot turn possible between this check and the change below.
	if effect == outbox.EffectPossible && (req.Action == ActionCancel || (req.Action == ActionRetry && !req.Force)) {
		return &InvalidStateError{IntentID: req.IntentID, Action: req.Action, Status: from, Allowed: allowedFrom[req.Action], Effect: effect}
	}
	forced := req.Action == ActionRetry && req.Force && effect == outbox.EffectPossible
	res.Forced = forced
	if req.Action == ActionCancel && !from.Terminal() {
		inFlight, err := attemptInFlight(ctx, tx, sch, req.IntentID, kind, key, idempotency.Fingerprint(kind, payload), attempts)
		if err != nil {
			return err
		}
		if inFlight {
			return &InvalidStateError{IntentID: req.IntentID, Action: req.Action, Status: from, Allowed: allowedFrom[req.Action], InFlight: true}
		}
	}

	var to outbox.Status
	switch req.Action {
	case ActionRetry:
		to = outbox.StatusPending
		// Back to the dispatcher's queue as if new: no claim, no relay, no
		// outcome. last_error is cleared here and kept in the event. The
		// effect stays: a forced retry's intent still may have performed
		// it, and a later retry needs force again.
		if err := intents.In(sch).Retry(ctx, tx, req.IntentID); err != nil {
			return fmt.Errorf("retry: %w", err)
		}
		if k != nil {
			switch {
			case k.state == idempotency.StateHeld && forced:
				// The operator accepted a second effect: the next attempt
				// executes afresh. Unholding instead would make it Recover,
				// and where the destination has no lookup the key would be
				// held again without a new attempt.
				if _, err := tx.Exec(ctx, sch.SQL(`DELETE FROM fencegate.idempotency_keys WHERE kind = $1 AND idempotency_key = $2`), kind, key); err != nil {
					return fmt.Errorf("delete held idempotency key: %w", err)
				}
				res.Key = KeyDeleted
			case k.state == idempotency.StateHeld:
				// The outcome of the last attempt is unknown: the effect
				// may have happened. Unholding (what idempotency.Store.Unhold
				// does, here inside our transaction) makes the key started
				// with an expired lock and a fresh token, so the next
				// attempt is told to Recover — look the outcome up at the
				// destination before sending — and no earlier attempt's
				// token matches any more.
				if _, err := tx.Exec(ctx, sch.SQL(`UPDATE fencegate.idempotency_keys
					SET state = 'started', status = NULL, locked_until = clock_timestamp(),
					    token = nextval('fencegate.idempotency_token_seq'), updated_at = now()
					WHERE kind = $1 AND idempotency_key = $2`), kind, key); err != nil {
					return fmt.Errorf("unhold idempotency key: %w", err)
				}
				res.Key = KeyUnheld
			case k.state == idempotency.StateCompleted && k.status != nil && *k.status == string(outbox.StatusFailed):
				// A key completed as failed answers Done(failed) to every
				// later attempt, so the retry would fail again without
				// trying. Failed means the effect did not happen (a
				// permanent refusal), so deleting the key cannot cause a
				// second effect: the retry starts a fresh attempt. A key
				// completed as succeeded stays: the effect happened, and the
				// retry must get Done(succeeded), not a second send. A
				// started key stays too: an attempt owns it.
				if _, err := tx.Exec(ctx, sch.SQL(`DELETE FROM fencegate.idempotency_keys WHERE kind = $1 AND idempotency_key = $2`), kind, key); err != nil {
					return fmt.Errorf("delete failed idempotency key: %w", err)
				}
				res.Key = KeyDeleted
			}
		}
		// Wake the dispatchers at commit, as an enqueue does.
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, sch.IntentsChannel()); err != nil {
			return fmt.Errorf("notify: %w", err)
		}
	case ActionCancel:
		to = outbox.StatusCancelled
		// A held key stays held: the effect of an unknown intent may have
		// happened, and cancelling the intent does not tell us whether. An
		// adapter's Begin refuses to start an attempt for a cancelled
		// intent, so a pending intent a dispatcher relays anyway is not
		// executed.
		if err := intents.In(sch).Cancel(ctx, tx, req.IntentID); err != nil {
			return fmt.Errorf("cancel: %w", err)
		}
	case ActionResolve:
		to = req.Outcome
		errMsg := lastError
		if to == outbox.StatusSucceeded {
			errMsg = nil
		}
		if err := intents.In(sch).Resolve(ctx, tx, req.IntentID, string(to), errMsg); err != nil {
			return fmt.Errorf("resolve: %w", err)
		}
		if to == outbox.StatusSucceeded {
			res.Effect = outbox.EffectDone // as Resolve records it
		}
		if k != nil && k.state == idempotency.StateHeld {
			// Record the outcome the operator found under the key too, so
			// later intents with this key get Done with it instead of
			// waiting on a held key forever (or, once unheld, looking up
			// again what the operator already established).
			if _, err := tx.Exec(ctx, sch.SQL(`UPDATE fencegate.idempotency_keys
				SET state = 'completed', status = $3, locked_until = NULL,
				    last_error = $4, completed_at = now(), updated_at = now()
				WHERE kind = $1 AND idempotency_key = $2`), kind, key, string(to), errMsg); err != nil {
				return fmt.Errorf("complete idempotency key: %w", err)
			}
			res.Key = KeyCompleted
		}
	}
	var note any
	switch {
	case forced && req.Note != "":
		note = ForcedNote + "; " + req.Note
	case forced:
		note = ForcedNote
	case req.Note != "":
		note = req.Note
	}
	if err := tx.QueryRow(ctx, sch.SQL(`INSERT INTO fencegate.intent_events (intent_id, actor, action, from_status, to_status, note, last_error)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING event_id`),
		req.IntentID, req.Actor, string(req.Action), string(from), string(to), note, lastError).Scan(&res.EventID); err != nil {
		return fmt.Errorf("record event: %w", err)
	}
	res.Status = to
	return nil
}
