// Package errmap is the one mapping from fencegate's errors to its public
// contract: the error code, the CLI's exit code, the admin API's HTTP status
// and the extra fields of the JSON error object
// ({"error":{"code","message","field"?, …}}). The CLI (package cli) and the
// admin API (admin) both answer through Map and the table of codes here, so
// the two cannot drift: a stale epoch is exit 3 and 409 stale_epoch with
// resource, supplied_epoch and current_epoch, from the issuer or the outbox,
// on either interface.
package errmap

import (
	"context"
	"errors"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Code is an error code of the contract (the JSON error object's "code").
type Code string

// The contract's codes. Each has one exit code and one HTTP status (see
// Code.Exit and Code.Status); the README's CLI contract and admin API
// tables list them.
const (
	// InvalidInput: bad input, nothing stored; the error names the field.
	InvalidInput Code = "invalid_input"
	// NotFound: no such intent or resource (or endpoint).
	NotFound Code = "not_found"
	// StaleEpoch: fenced out (resource, supplied_epoch, current_epoch).
	StaleEpoch Code = "stale_epoch"
	// LeaseHeld: another holder's lease is live (resource, holder,
	// current_epoch, expires_at).
	LeaseHeld Code = "lease_held"
	// Conflict: an operation id reused with different content (resource,
	// operation_id, intent_id).
	Conflict Code = "conflict"
	// InvalidState: the intent's status does not allow the operator's
	// action (the admin API's per-intent actions, 409, and the CLI's,
	// exit 5: a conflict with the intent's state).
	InvalidState Code = "invalid_state"
	// Busy: a grant or an enqueue gave up waiting for a locked control row
	// (resource); nothing was granted or stored, retry.
	Busy Code = "busy"
	// Unavailable: PostgreSQL (or another dependency) cannot be reached or
	// is a standby.
	Unavailable Code = "unavailable"
	// AuthorityChanged: a grant refused because the database is not the
	// epoch authority on record (lease.ErrAuthorityChanged: its system
	// identifier changed or its timeline went backwards; reason,
	// resource, recorded_system_identifier, system_identifier (strings:
	// they exceed 2^53), recorded_timeline, timeline). Like a standby, a
	// database that must not grant: exit 1 and 503, but retrying does not
	// help until an operator accepts the database.
	AuthorityChanged Code = "authority_changed"
	// UnsafeDatabase: PostgreSQL runs with fsync=off (CLI only).
	UnsafeDatabase Code = "unsafe_database"
	// Internal: anything else.
	Internal Code = "internal"
	// BodyTooLarge: a request body over the limit (admin API only).
	BodyTooLarge Code = "body_too_large"
	// Unauthorized: a missing or unknown token (admin API only).
	Unauthorized Code = "unauthorized"
	// Forbidden: a token of the wrong role or outside its scope (admin
	// API), or what the rule set does not allow the principal (every way
	// in; with field and principal).
	Forbidden Code = "forbidden"
	// MethodNotAllowed: a path that exists for other methods (admin API
	// only).
	MethodNotAllowed Code = "method_not_allowed"
	// Misdirected: a non-loopback Host without API tokens (admin API
	// only).
	Misdirected Code = "misdirected"
	// TooManyFailures: too many failed authentications from one address
	// within the window (admin API only; with Retry-After).
	TooManyFailures Code = "too_many_failures"
)

// The CLI's exit codes, part of the public contract.
const (
	ExitOK       = 0
	ExitInternal = 1 // internal, unavailable, busy, authority_changed, unsafe_database
	ExitBadInput = 2 // invalid_input, not_found
	ExitStale    = 3 // stale_epoch
	ExitHeld     = 4 // lease_held
	ExitConflict = 5 // conflict, invalid_state
)

// answer is a code's exit code and HTTP status.
type answer struct{ exit, status int }

// answers is the contract: one row per code. A code the CLI never gives
// (the admin API's own) still has an exit code, 1 like internal (2 for
// body_too_large, bad input), and one the API never gives
// (unsafe_database) a status, 500, so every code answers both.
var answers = map[Code]answer{
	InvalidInput:     {ExitBadInput, http.StatusBadRequest},
	NotFound:         {ExitBadInput, http.StatusNotFound},
	StaleEpoch:       {ExitStale, http.StatusConflict},
	LeaseHeld:        {ExitHeld, http.StatusConflict},
	Conflict:         {ExitConflict, http.StatusUnprocessableEntity},
	InvalidState:     {ExitConflict, http.StatusConflict},
	Busy:             {ExitInternal, http.StatusServiceUnavailable},
	Unavailable:      {ExitInternal, http.StatusServiceUnavailable},
	AuthorityChanged: {ExitInternal, http.StatusServiceUnavailable},
	UnsafeDatabase:   {ExitInternal, http.StatusInternalServerError},
	Internal:         {ExitInternal, http.StatusInternalServerError},
	BodyTooLarge:     {ExitBadInput, http.StatusBadRequest},
	Unauthorized:     {ExitInternal, http.StatusUnauthorized},
	Forbidden:        {ExitBadInput, http.StatusForbidden},
	MethodNotAllowed: {ExitInternal, http.StatusMethodNotAllowed},
	Misdirected:      {ExitInternal, http.StatusMisdirectedRequest},
	TooManyFailures:  {ExitInternal, http.StatusTooManyRequests},
}

// Codes returns every code of the contract, sorted (the admin API's
// OpenAPI description is held to it).
func Codes() []Code {
	return slices.Sorted(maps.Keys(answers))
}

// Exit returns the CLI's exit code for c (ExitInternal for a code not in
// the contract).
func (c Code) Exit() int {
	if a, ok := answers[c]; ok {
		return a.exit
	}
	return ExitInternal
}

// Status returns the admin API's HTTP status for c (500 for a code not in
// the contract).
func (c Code) Status() int {
	if a, ok := answers[c]; ok {
		return a.status
	}
	return http.StatusInternalServerError
}

// Error is an error as the contract tells it: a code, a message and the
// code's extra fields.
type Error struct {
	Code    Code
	Message string
	// Field names the input that is wrong (invalid_input, body_too_large);
	// empty for other codes.
	Field string
	// Extra holds the code's other fields (resource, current_epoch,
	// supplied_epoch, holder, expires_at, operation_id, intent_id, …).
	Extra map[string]any
	// RetryAfter, when positive, is the admin API's Retry-After header in
	// seconds (busy).
	RetryAfter int
}

func (e *Error) Error() string { return e.Message }

// Exit returns the CLI's exit code.
func (e *Error) Exit() int { return e.Code.Exit() }

// Status returns the admin API's HTTP status.
func (e *Error) Status() int { return e.Code.Status() }

// Body returns the JSON error object: code, message, field when set, and
// the extra fields.
func (e *Error) Body() map[string]any {
	body := map[string]any{"code": string(e.Code), "message": e.Message}
	if e.Field != "" {
		body["field"] = e.Field
	}
	for k, v := range e.Extra {
		body[k] = v
	}
	return body
}

// New returns an error with code and message.
func New(code Code, message string) *Error { return &Error{Code: code, Message: message} }

// Invalid returns an invalid_input error naming field.
func Invalid(field, message string) *Error {
	return &Error{Code: InvalidInput, Message: message, Field: field}
}

// Map returns err as the contract tells it. An *Error (anywhere in err's
// chain) is returned as is; the module's typed errors get their code and
// fields; an unreachable database is unavailable; anything else is
// internal. Messages of internal and unavailable errors are made one line
// (a pgx error may span several).
func Map(err error) *Error {
	var (
		e     *Error
		stale *fenceerr.StaleEpochError
		held  *lease.HeldError
		busy  *lease.BusyError
		obusy *outbox.BusyError
		auth  *lease.AuthorityError
		conf  *outbox.ConflictError
		inv   *fenceerr.InvalidError
		forb  *fenceerr.ForbiddenError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &e):
		return e
	case errors.As(err, &stale):
		return &Error{Code: StaleEpoch, Message: err.Error(), Extra: map[string]any{
			"resource": stale.Resource, "supplied_epoch": stale.Supplied, "current_epoch": stale.Current}}
	case errors.As(err, &held):
		return &Error{Code: LeaseHeld, Message: err.Error(), Extra: map[string]any{
			"resource": held.Resource, "holder": held.Holder, "current_epoch": held.Epoch, "expires_at": held.ExpiresAt}}
	case errors.As(err, &busy):
		// Retryable, nothing granted: the control row stayed locked by an
		// open transaction (a paused worker) past the lock timeout.
		return &Error{Code: Busy, Message: err.Error(), RetryAfter: 1, Extra: map[string]any{"resource": busy.Resource}}
	case errors.As(err, &obusy):
		// Retryable, nothing stored: an enqueue gave up on a lock the
		// same way (outbox.Config.LockTimeout). A batch names no resource.
		e := &Error{Code: Busy, Message: OneLine(err.Error()), RetryAfter: 1}
		if obusy.Resource != "" {
			e.Extra = map[string]any{"resource": obusy.Resource}
		}
		return e
	case errors.As(err, &auth):
		// Not retryable: the database may lack grants the authority made
		// (docs/guarantees.md, "After a failover").
		return &Error{Code: AuthorityChanged, Message: OneLine(err.Error()), Extra: map[string]any{
			"resource": auth.Resource, "reason": auth.Reason,
			"recorded_system_identifier": strconv.FormatInt(auth.RecordedSystemIdentifier, 10),
			"system_identifier":          strconv.FormatInt(auth.SystemIdentifier, 10),
			"recorded_timeline":          auth.RecordedTimeline, "timeline": auth.Timeline}}
	case errors.As(err, &conf):
		return &Error{Code: Conflict, Message: err.Error(), Extra: map[string]any{
			"resource": conf.Resource, "operation_id": conf.OperationID, "intent_id": conf.IntentID}}
	case errors.As(err, &inv):
		return Invalid(inv.Field, err.Error())
	case errors.As(err, &forb):
		return &Error{Code: Forbidden, Message: err.Error(), Field: forb.Field, Extra: map[string]any{"principal": forb.Principal}}
	case errors.Is(err, lease.ErrStandby):
		return New(Unavailable, OneLine(err.Error()))
	case readOnly(err):
		// Nothing was written. A connection checked once for a primary
		// can reach a standby later behind a pooler (or the server is
		// set read-only); the write can succeed once it reaches the
		// primary again, so it is the dependency that is down.
		return New(Unavailable, "the database refused a write as read-only (a standby, or default_transaction_read_only): "+
			OneLine(err.Error()))
	case errors.Is(err, fenceerr.ErrNotFound):
		return New(NotFound, err.Error())
	case DatabaseUnavailable(err) || errors.Is(err, nats.ErrNoServers):
		return New(Unavailable, OneLine(err.Error()))
	case pgschema.Missing(err):
		// Nothing was stored: the statement found none of fencegate's
		// tables where --schema says they are.
		return Invalid("schema", "fencegate is not migrated in this schema of the database ("+OneLine(err.Error())+
			"): run gateway migrate --schema with this --schema, or pass the schema it was migrated into (--schema, $GATEWAY_SCHEMA)")
	}
	return New(Internal, OneLine(err.Error()))
}

// DatabaseUnavailable reports whether err means PostgreSQL could not be
// reached (refused, timed out, the connection lost, the server shutting
// down) rather than a statement failing. It judges by the error's type and
// SQLSTATE, never its text.
func DatabaseUnavailable(err error) bool {
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) || pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	// A server's answer is a statement failing unless its SQLSTATE says the
	// connection is the problem; checked before the network errors, which a
	// PgError never wraps.
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08: connection exception; 57P01-57P03: admin shutdown,
		// crash shutdown, cannot connect now.
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	// A socket's dial, read or write failing. (Not any net.Error: a bare
	// syscall.Errno, as in a file's *fs.PathError, implements it too.)
	var opErr *net.OpError
	var dnsErr *net.DNSError
	if errors.As(err, &opErr) || errors.As(err, &dnsErr) {
		return true
	}
	// pgconn marks the errors that happened before anything reached the
	// server (a closed or busy connection, a failed receive).
	return pgconn.SafeToRetry(err)
}

// readOnly reports whether err is PostgreSQL refusing a write in a
// read-only transaction (SQLSTATE 25006).
func readOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006"
}

// OneLine joins s's lines and runs of blanks into one line.
func OneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
