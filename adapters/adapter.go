// Package adapters is the adapter SPI: what an adapter author implements
// (Executor, and Looker where the destination can look an effect up) or
// returns (Capabilities, Outcome, the error classes RetryableError,
// PermanentError and UnknownError, and Registration, the adapter as a
// composition root takes it). The built-in adapters (adapters/email,
// adapters/file, adapters/webhook, adapters/s3) implement it, and
// adapters/adaptertest checks an implementation against the runtime.
//
// The runtime that calls an Executor — consume a relayed intent, fence it,
// execute its effect at most once per business idempotency key, record the
// outcome — is package executor (Runtime, Config, NewRuntime, the
// unknown-outcome policies and the runtime's defaults). It imports this
// package, not the other way round, so an adapter depends only on the
// interface it implements.
package adapters

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/fencegate/fencegate/outbox"
)

// Registration is one adapter as a composition root takes it: its kind,
// the intake rules of the kind's payload, the executor that performs its
// effect and an optional probe. gateway.Config.Adapters and
// cli.Options.Adapters take a list of them, and from that one list the
// gateway builds the kinds its intake accepts, the runtime's executors and
// the probes it runs at start:
//
//	n := &Notifier{Endpoint: endpoint}
//	reg := adapters.Registration{Kind: n.Kind(), Spec: outbox.TypedKind[Payload](outbox.FenceCommit), Executor: n}
//
// The built-in adapters return theirs (email.Adapter.Registration, …).
type Registration struct {
	// Kind is the intent kind ("email", "notify"). Required; with an
	// Executor it is Executor.Kind().
	Kind string
	// Spec is the kind's intake rules: its default fence and the check of
	// its payload, applied by the gateway's outbox client (the admin API's
	// intake) and listed on the admin pages. Required.
	Spec outbox.KindSpec
	// Executor performs the kind's effect in this process. Nil: the kind
	// is accepted at the intake and executed by another process.
	Executor Executor
	// Probe, when set, is called once at start, before the runtime
	// consumes anything; an error stops the start. It checks that the
	// destination keeps what the adapter relies on (an S3 server that
	// enforces conditional writes), which a later failure would not say.
	Probe func(ctx context.Context) error
}

// Request is one intent to execute, as loaded from PostgreSQL.
type Request struct {
	IntentID       int64
	Resource       string
	Epoch          int64
	Kind           string
	IdempotencyKey string
	Fence          outbox.Fence
	Payload        json.RawMessage
	// Attempt counts execution attempts of this intent, from 1.
	Attempt int

	// stillOwner is the runtime's ownership check (see StillOwner).
	stillOwner func(ctx context.Context) error
}

// ErrNotOwner is matched (errors.Is) by StillOwner's error: the attempt no
// longer owns the intent's idempotency key, or could not confirm that it
// does, and must not perform the irrevocable step of its effect.
var ErrNotOwner = errors.New("adapters: the attempt no longer owns its idempotency key")

// StillOwner re-validates, right before the irrevocable step of the effect
// (the SMTP end-of-data marker, a rename into place), that this attempt
// still owns the intent's idempotency key with a live lock. On an error
// (matching ErrNotOwner) the executor must not take that step; it aborts —
// the effect did not happen — and returns a retryable error. The check is
// one indexed read in PostgreSQL; call it once, as late as possible. On a
// Request the runtime did not build it returns nil.
func (r Request) StillOwner(ctx context.Context) error {
	if r.stillOwner == nil {
		return nil
	}
	if err := r.stillOwner(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrNotOwner, err)
	}
	return nil
}

// WithOwnerCheck returns r with check as its StillOwner check (the runtime
// sets it; tests of executors can too).
func (r Request) WithOwnerCheck(check func(ctx context.Context) error) Request {
	r.stillOwner = check
	return r
}

// Outcome is what an executor reports, to be recorded on the intent and
// under its idempotency key.
type Outcome struct {
	// Status is outbox.StatusSucceeded (the default when empty), or
	// outbox.StatusSuperseded when the destination itself fenced the
	// intent out (an older epoch). Execute returning another status with
	// a nil error is an adapter bug: the runtime takes it as an unknown
	// outcome (the effect may have happened), never as failed; a failure
	// is a PermanentError. (Looker.Lookup may also return
	// outbox.StatusUnknown; see Looker.)
	Status outbox.Status
	// Result is a JSON object describing the effect (message id, path, …);
	// empty or null: none. Anything else is an adapter bug: the runtime
	// records the status reported with the result replaced by an object
	// saying so ({"invalid_result": "<its first bytes>", …}) and logs it
	// at ERROR.
	Result json.RawMessage
}

// Capabilities is what an executor's destination can do, declared once as
// one value (Executor.Capabilities) and read by the runtime when it is
// made.
type Capabilities struct {
	// Lookup: the destination can tell whether the effect of an
	// idempotency key already happened; the executor implements Looker.
	// The runtime then looks an unknown outcome up instead of holding it.
	Lookup bool
	// DedupsOnKey: the destination itself drops a second effect with the
	// same idempotency key, so executing again after an unknown outcome is
	// safe (executor.Config.Unknown resend).
	DedupsOnKey bool
	// LookupSettle is how long after an attempt's last I/O with the
	// destination a lookup that finds nothing is trusted as proof that the
	// effect did not happen (a relay that stores a message after the final
	// dot, an eventually consistent API). Zero: the runtime's
	// executor.Config.LookupSettle.
	LookupSettle time.Duration
	// Concurrency is the most executions at once the destination should
	// get (an SMTP server's session limit); the runtime runs
	// min(executor.Config.Concurrency, Concurrency) of this kind at once.
	// Zero: no limit of its own.
	Concurrency int
	// ForRequest, when set, says what the destination of one request can
	// do, for an executor whose destinations differ (a webhook: some hosts
	// dedup on the key, some payloads name a lookup URL). The runtime calls
	// it whenever it decides about an unknown outcome of req, and uses its
	// answer instead of Lookup and DedupsOnKey above (a request can be
	// looked up only if Lookup is declared above too, and the executor is
	// a Looker). A per-request DedupsOnKey is a statement about that one
	// destination (an operator listed it), so an unknown outcome there is
	// resent with the same key whatever executor.Config.Unknown says. Nil:
	// Lookup and DedupsOnKey hold for every request.
	ForRequest func(req Request) RequestCapabilities
}

// RequestCapabilities is what one request's destination can do
// (Capabilities.ForRequest).
type RequestCapabilities struct {
	// Lookup: req's outcome can be looked up (Looker.Lookup).
	Lookup bool
	// DedupsOnKey: req's destination drops a second effect with the same
	// idempotency key, so an unknown outcome is resent.
	DedupsOnKey bool
}

// Executor performs the external effect of one kind of intent.
//
// Execute's error says what became of the effect, and only the adapter can
// tell, so it must say it explicitly:
//   - RetryableError: the effect did not happen, and trying again may
//     succeed (a refusal such as an SMTP 4xx, a disk error before the
//     write). The key is released and the intent retried.
//   - PermanentError: the effect did not happen and never will with this
//     payload (a 5xx, a bad payload). The intent fails for good.
//   - UnknownError: the effect may or may not have happened (the
//     connection dropped after the request was sent).
//
// Any other error — one the adapter did not classify, such as a plain
// fmt.Errorf around a connection reset — is taken as an unknown outcome:
// looked up where the destination can (Capabilities.Lookup), held for an
// operator otherwise. Never as a failure: a request that may have reached
// the destination must not be recorded as one that did not.
//
// A panic in Execute is recovered by the runtime and taken the same way,
// as an unknown outcome (the attempt had begun the key, so the effect may
// have happened): looked up where the executor declares Lookup, held
// unknown (effect possible) otherwise, with last_error "adapter panicked:
// <value>" and the stack logged at ERROR. The process and its other
// adapters go on. A panic in Lookup is a failed lookup. Both are bugs.
type Executor interface {
	// Kind is the intent kind this executor serves ("email", "file").
	Kind() string
	// Capabilities declares what the destination can do.
	Capabilities() Capabilities
	// Execute performs the effect once; see the type's doc for its errors.
	Execute(ctx context.Context, req Request) (Outcome, error)
}

// Looker is implemented by executors whose destination can tell whether the
// effect of an idempotency key already happened (result lookup), and that
// declare Capabilities.Lookup. It is used when an earlier attempt started
// and its outcome was lost. A found effect is trusted at once; found=false
// is trusted as proof that the effect did not happen only once the settle
// window (Capabilities.LookupSettle, executor.Config.LookupSettle) has
// passed since the last I/O with the destination.
type Looker interface {
	// Lookup returns the outcome of req's idempotency key at the
	// destination, and found=false when the destination has no trace of it.
	// A found outcome's Status is succeeded (the default when empty),
	// failed or superseded. An outcome with Status unknown (found) says the
	// destination has a trace that settles nothing: the runtime holds the
	// intent unknown for an operator (counted as held_by_lookup), never
	// executes it again. Another status is an adapter bug: the intent is
	// held unknown too, with last_error naming it (adapter_bad_outcome).
	// An error means the lookup could not tell: the runtime looks up again
	// later, the intent waiting (last_error says why) — unless the error is
	// a PermanentError (the lookup will never answer: credentials refused,
	// no such endpoint), which holds the intent unknown for an operator.
	Lookup(ctx context.Context, req Request) (out Outcome, found bool, err error)
}

// Retryable is implemented by errors that say whether a retry may succeed.
type Retryable interface {
	Retryable() bool
}

// IsRetryable reports whether err says it is retryable.
func IsRetryable(err error) bool {
	var r Retryable
	return errors.As(err, &r) && r.Retryable()
}

// Error is an executor error with its retry class.
type Error struct {
	Err   error
	Retry bool
	// Unknown marks an error after which the effect may or may not have
	// happened (for example the connection dropped after the message was
	// sent). The runtime then looks the outcome up or applies the unknown
	// outcome policy, instead of re-executing.
	Unknown bool
	// RetryAfter, on a retryable error, is the least time to wait before
	// the next attempt (an HTTP Retry-After); the runtime waits at least
	// that long, at most executor.Config.MaxRetryAfter, and writes when
	// the retry is due on the intent (not_before) so that nothing executes
	// it earlier. On an Unknown error it defers a resend with the same
	// key (to a destination that dedups on it) the same way.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	kind := "permanent"
	switch {
	case e.Unknown:
		kind = "outcome unknown"
	case e.Retry:
		kind = "retryable"
	}
	return fmt.Sprintf("%s: %v", kind, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Retryable reports whether a retry may succeed.
func (e *Error) Retryable() bool { return e.Retry }

// RetryableError wraps err as retryable: the effect did not happen.
func RetryableError(err error) error { return &Error{Err: err, Retry: true} }

// RetryableAfter wraps err as retryable no sooner than after d (a
// destination's Retry-After): the effect did not happen.
func RetryableAfter(err error, d time.Duration) error {
	return &Error{Err: err, Retry: true, RetryAfter: max(d, 0)}
}

// RetryAfter reads an HTTP Retry-After header's value for RetryableAfter:
// seconds, or an HTTP date (judged against now); 0 when empty or neither.
// Seconds past what a time.Duration holds saturate at the longest one
// (the runtime then waits its MaxRetryAfter): multiplied as they are, they
// would wrap around to a short or negative delay.
func RetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseUint(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if s > uint64(math.MaxInt64/int64(time.Second)) {
			return math.MaxInt64
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

// PermanentError wraps err as permanent: the effect did not happen and
// never will.
func PermanentError(err error) error { return &Error{Err: err} }

// UnknownError wraps err as an attempt whose outcome is unknown.
func UnknownError(err error) error { return &Error{Err: err, Unknown: true} }

// IsPermanent reports whether err was classified permanent (PermanentError):
// the effect did not happen and never will with this payload.
func IsPermanent(err error) bool {
	var e *Error
	return errors.As(err, &e) && !e.Retry && !e.Unknown
}

// IsUnknown reports whether err marks an unknown outcome explicitly
// (UnknownError). The runtime also takes an error that is neither
// retryable nor permanent as unknown.
func IsUnknown(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Unknown
}
