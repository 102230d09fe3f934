package idempotency

import (
	"errors"
	"fmt"
	"time"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/outbox"
)

// ErrLostOwnership is matched (errors.Is) by an *OwnershipError: the
// attempt's token is no longer the key's current token (another attempt took
// the key over, it was released, or it was swept), so the attempt may not
// write the key's outcome. Nothing was written.
var ErrLostOwnership = errors.New("attempt lost ownership of the idempotency key")

// ErrNotFound is returned when no key matches. It matches
// fenceerr.ErrNotFound.
var ErrNotFound = fenceerr.NotFound("idempotency key not found")

// ErrNotHeld is returned by Unhold when the key is not held.
var ErrNotHeld = errors.New("idempotency key is not held")

// ErrIntentNotFound is returned when the intent id names no intent. Nothing
// was written. It matches fenceerr.ErrNotFound.
var ErrIntentNotFound = fenceerr.NotFound("intent not found")

// ErrIntentTerminal is matched by an *IntentTerminalError: Begin refuses to
// start an attempt for an intent that already has its final status (for
// example cancelled by an operator). Nothing was written.
var ErrIntentTerminal = errors.New("intent already has a final status")

// ErrInvalid is matched by an *InvalidError. It is fenceerr.ErrInvalid,
// shared with lease, outbox and admin.
var ErrInvalid = fenceerr.ErrInvalid

// OwnershipError says which attempt lost the key and who holds it now.
type OwnershipError struct {
	Kind  string
	Key   string
	Token int64
	// CurrentToken is the key's current token, 0 when the key is gone.
	CurrentToken int64
	// State is the key's current state, "" when the key is gone.
	State State
}

func (e *OwnershipError) Error() string {
	if e.State == "" {
		return fmt.Sprintf("idempotency key %s/%q: attempt token %d lost ownership: the key no longer exists", e.Kind, e.Key, e.Token)
	}
	return fmt.Sprintf("idempotency key %s/%q: attempt token %d lost ownership: key is %s with token %d", e.Kind, e.Key, e.Token, e.State, e.CurrentToken)
}

// Is reports whether target is ErrLostOwnership.
func (e *OwnershipError) Is(target error) bool { return target == ErrLostOwnership }

// IntentTerminalError names the intent and its final status.
type IntentTerminalError struct {
	IntentID int64
	Status   outbox.Status
}

func (e *IntentTerminalError) Error() string {
	return fmt.Sprintf("intent %d is already %s", e.IntentID, e.Status)
}

// Is reports whether target is ErrIntentTerminal.
func (e *IntentTerminalError) Is(target error) bool { return target == ErrIntentTerminal }

// ErrDeferred matches a *DeferredError.
var ErrDeferred = errors.New("the intent's next attempt is deferred")

// DeferredError says that the intent's next attempt is deferred (its
// not_before is still ahead, by Remaining, by PostgreSQL's clock), so no
// attempt was counted and nothing was written. Begin answers it as Busy
// with that RetryAfter and creates no key; BeginIO (an owner that resumed
// its key) returns it, and its caller comes back after Remaining, keeping
// the key.
type DeferredError struct {
	IntentID  int64
	Remaining time.Duration
}

func (e *DeferredError) Error() string {
	return fmt.Sprintf("intent %d: its next attempt is deferred for %s", e.IntentID, e.Remaining)
}

// Is reports whether target is ErrDeferred.
func (e *DeferredError) Is(target error) bool { return target == ErrDeferred }

// InvalidError names the argument that is wrong. It is
// fenceerr.InvalidError, the one invalid-input type of the module.
type InvalidError = fenceerr.InvalidError

// invalid returns an *InvalidError naming field, wrapped so that its text
// keeps saying where it comes from ("idempotency: field: message").
func invalid(field, format string, args ...any) error {
	return fmt.Errorf("idempotency: %w", &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)})
}
