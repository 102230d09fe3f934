// Package fenceerr is fencegate's one error vocabulary: the sentinels and
// error types that more than one package returns. lease, outbox,
// idempotency and admin re-export them under their own names
// (lease.ErrStaleEpoch, outbox.ErrStaleEpoch, outbox.ValidationError,
// lease.InvalidError, …), so a caller can match an error with either the
// package's name or this package's:
//
//	errors.Is(err, fenceerr.ErrStaleEpoch) // a stale epoch from the issuer or the outbox
//	var inv *fenceerr.InvalidError
//	errors.As(err, &inv) // inv.Field names the input that is wrong
//
// Errors that belong to one package only (lease.HeldError,
// outbox.ConflictError, idempotency.OwnershipError, …) stay there; so do
// lease.BusyError and outbox.BusyError, which both match ErrBusy.
package fenceerr

import (
	"errors"
	"fmt"
)

// ErrStaleEpoch is matched (errors.Is) by every *StaleEpochError: the epoch
// a caller supplied is no longer, or never was, the resource's current one,
// wherever it was checked (a renew or release at the issuer, an enqueue at
// the outbox). Nothing was stored or changed.
var ErrStaleEpoch = errors.New("stale epoch")

// ErrInvalid is matched by every *InvalidError: bad input, refused before
// anything was stored.
var ErrInvalid = errors.New("invalid input")

// ErrNotFound is matched by every package's own not-found error (made by
// NotFound): no intent, resource or key matches.
var ErrNotFound = errors.New("not found")

// ErrBusy is matched by every package's busy error (lease.BusyError,
// outbox.BusyError): a grant or an enqueue gave up waiting for a lock it
// needed, the resource's control row held by an open transaction (a worker
// paused inside outbox.EnqueueTx, a lease grant), after its lock timeout.
// Nothing was granted, changed or stored; retry.
var ErrBusy = errors.New("resource busy: its control row is locked")

// StaleEpochError names the resource, the epoch supplied and the current
// one. Nothing was stored or changed.
type StaleEpochError struct {
	Resource string
	Supplied int64
	// Current is the resource's current epoch, 0 when none was ever issued.
	Current int64
	// Reason says why, when the epoch is current but the call still fails
	// (for example the lease was released or belongs to another holder).
	Reason string
}

func (e *StaleEpochError) Error() string {
	msg := fmt.Sprintf("stale epoch for resource %q: supplied %d, current %d", e.Resource, e.Supplied, e.Current)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// Is reports whether target is ErrStaleEpoch.
func (e *StaleEpochError) Is(target error) bool { return target == ErrStaleEpoch }

// InvalidError names the input (argument, request or intent field) that is
// wrong and says why. Nothing was stored.
type InvalidError struct {
	// Field is the input's name as the caller spelled it (resource, epoch,
	// payload.to[1], intent_id, …).
	Field   string
	Message string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Message }

// Is reports whether target is ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// Invalid returns an *InvalidError naming field, its message formatted
// from format and args.
func Invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Within puts an invalid-input error of a part under the part's field: a
// Policy's "FromAllow" is "Policy.FromAllow" in the Config holding it.
// Other errors, and nil, pass as they are.
func Within(part string, err error) error {
	var inv *InvalidError
	if err == nil || !errors.As(err, &inv) {
		return err
	}
	return &InvalidError{Field: part + "." + inv.Field, Message: inv.Message}
}

// ErrForbidden is matched by a *ForbiddenError.
var ErrForbidden = errors.New("forbidden")

// ForbiddenError says the rule set (package policy) does not allow what was
// asked: Principal (empty: the caller acts as no principal) may not touch
// what Field names (principal, role, resource, kind, epochs). Nothing was
// stored or locked.
type ForbiddenError struct {
	Principal string
	Field     string
	Message   string
	// Err is the refusal as it came (a PostgreSQL error), if any.
	Err error
}

func (e *ForbiddenError) Error() string { return "forbidden: " + e.Message }

// Unwrap returns Err.
func (e *ForbiddenError) Unwrap() error { return e.Err }

// Is reports whether target is ErrForbidden.
func (e *ForbiddenError) Is(target error) bool { return target == ErrForbidden }

// NotFound returns a package's own not-found sentinel with message msg:
// errors.Is matches it by identity (outbox.ErrNotFound is not
// operator.ErrResourceNotFound) and matches ErrNotFound, so one check maps
// them all to the contract's not_found.
func NotFound(msg string) error { return &notFoundError{msg: msg} }

type notFoundError struct{ msg string }

func (e *notFoundError) Error() string { return e.msg }

func (e *notFoundError) Is(target error) bool { return target == ErrNotFound }
