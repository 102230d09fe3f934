package outbox

import (
	"errors"
	"fmt"
)

// ErrStaleEpoch is matched (errors.Is) by a *StaleEpochError.
var ErrStaleEpoch = errors.New("stale epoch")

// ErrOperationConflict is matched by a *ConflictError: the operation id was
// used before for different content.
var ErrOperationConflict = errors.New("operation id reused with different content")

// ErrNotFound is returned when no intent matches.
var ErrNotFound = errors.New("intent not found")

// ErrInvalid is matched by a *ValidationError.
var ErrInvalid = errors.New("invalid intent")

// StaleEpochError says the supplied epoch is not the resource's current one.
// Nothing was stored.
type StaleEpochError struct {
	Resource string
	Supplied int64
	Current  int64
}

func (e *StaleEpochError) Error() string {
	return fmt.Sprintf("stale epoch for resource %q: supplied %d, current %d", e.Resource, e.Supplied, e.Current)
}

// Is reports whether target is ErrStaleEpoch.
func (e *StaleEpochError) Is(target error) bool { return target == ErrStaleEpoch }

// ConflictError names the existing intent that holds the operation id.
type ConflictError struct {
	Resource    string
	OperationID string
	IntentID    int64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("operation id %q of resource %q was used for intent %d with different content", e.OperationID, e.Resource, e.IntentID)
}

// Is reports whether target is ErrOperationConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrOperationConflict }

// ValidationError names the field of an intent that is wrong. Nothing was
// stored.
type ValidationError struct {
	Field   string
	Message string
}

func (e *ValidationError) Error() string { return e.Field + ": " + e.Message }

// Is reports whether target is ErrInvalid.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }
