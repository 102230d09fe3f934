package outbox

import (
	"errors"
	"fmt"

	"github.com/fencegate/fencegate/fenceerr"
)

// ErrStaleEpoch is matched (errors.Is) by a *StaleEpochError. It is
// fenceerr.ErrStaleEpoch, the same sentinel as lease.ErrStaleEpoch:
// errors.Is(err, outbox.ErrStaleEpoch) holds for a stale renew too.
var ErrStaleEpoch = fenceerr.ErrStaleEpoch

// ErrOperationConflict is matched by a *ConflictError: the operation id was
// used before for different content.
var ErrOperationConflict = errors.New("operation id reused with different content")

// ErrNotFound is returned when no intent matches. It matches
// fenceerr.ErrNotFound.
var ErrNotFound = fenceerr.NotFound("intent not found")

// ErrInvalid is matched by a *ValidationError. It is fenceerr.ErrInvalid,
// shared with lease, idempotency and admin.
var ErrInvalid = fenceerr.ErrInvalid

// StaleEpochError says the supplied epoch is not the resource's current one.
// Nothing was stored. It is fenceerr.StaleEpochError, the issuer's type
// too.
type StaleEpochError = fenceerr.StaleEpochError

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
// stored. It is fenceerr.InvalidError, the one invalid-input type of the
// module.
type ValidationError = fenceerr.InvalidError
