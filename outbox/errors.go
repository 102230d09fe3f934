package outbox

import (
	"errors"
	"fmt"
	"time"

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

// ErrBusy is matched by a *BusyError. It is fenceerr.ErrBusy, the same
// sentinel as lease.ErrBusy.
var ErrBusy = fenceerr.ErrBusy

// BusyError says an enqueue gave up waiting for a lock it needed: the
// resource's control row, held by an open transaction (a worker paused
// inside EnqueueTx for the same resource, a lease grant), or a row another
// open transaction is inserting with the same operation id or key. It
// waited Config.LockTimeout in the client's own transactions (Enqueue,
// EnqueueBatch, group commits), or the caller's lock_timeout inside
// EnqueueTx. The statement failed, so nothing was stored; retry.
type BusyError struct {
	// Resource is the intent's resource; empty for a batch, whose every
	// resource is locked in one statement (any of them).
	Resource string
	// Waited is the client's LockTimeout; 0 when the bound was the
	// transaction's own lock_timeout (EnqueueTx, EnqueueBatchTx).
	Waited time.Duration
	cause  error // PostgreSQL's error
}

func (e *BusyError) Error() string {
	what := fmt.Sprintf("resource %q", e.Resource)
	if e.Resource == "" {
		what = "a resource of the batch"
	}
	waited := ""
	if e.Waited > 0 {
		waited = " after " + e.Waited.String()
	}
	return fmt.Sprintf("outbox: enqueue: busy: %s is locked by an open transaction "+
		"(e.g. a worker paused inside EnqueueTx); gave up%s, nothing stored; retry", what, waited)
}

// Is reports whether target is ErrBusy.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// Unwrap returns PostgreSQL's error (lock_not_available), if any.
func (e *BusyError) Unwrap() error { return e.cause }

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
