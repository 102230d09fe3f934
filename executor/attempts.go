package executor

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/outbox"
)

// The attempt history (idempotency.Attempt, intent_attempts): what an
// attempt learnt on its way (the executor's error, a lookup's answer) is
// noted on its context by the step that learnt it, and written with the
// attempt's end by the step that records it.

type attemptNoteKey struct{}

// attemptNote is what one delivery's attempt learnt before its end.
type attemptNote struct {
	cause  error  // the executor's error, nil when it returned an outcome
	lookup string // found, not_found, error; "" when it looked nothing up
	// outcome is how the delivery ended, for its execute span: the
	// attempt's outcome in the history (a status, retry, lost_key, …), or
	// what ended a delivery that counted no attempt (done_before,
	// conflict, busy, superseded); status is the final status it recorded
	// on the intent ("" when none) and msg the error text recorded with it.
	outcome, msg string
	status       outbox.Status
}

func withAttemptNote(ctx context.Context) context.Context {
	return context.WithValue(ctx, attemptNoteKey{}, &attemptNote{})
}

func noteOf(ctx context.Context) *attemptNote {
	n, _ := ctx.Value(attemptNoteKey{}).(*attemptNote)
	return n
}

func noteCause(ctx context.Context, err error) {
	if n := noteOf(ctx); n != nil {
		n.cause = err
	}
}

func noteLookup(ctx context.Context, found bool, err error) {
	n := noteOf(ctx)
	if n == nil {
		return
	}
	switch {
	case err != nil:
		n.lookup = "error"
	case found:
		n.lookup = "found"
	default:
		n.lookup = "not_found"
	}
}

// noteOutcome notes how the delivery ended (the last note stands), with
// msg, the error text recorded with it ("" when none). An outcome that is
// a final status (succeeded, failed, superseded, unknown) is the status
// recorded on the intent.
func noteOutcome(ctx context.Context, outcome, msg string) {
	var status outbox.Status
	if st := outbox.Status(outcome); st.Terminal() && st != outbox.StatusCancelled {
		status = st
	}
	noteEnd(ctx, outcome, status, msg)
}

// noteEnd is noteOutcome for an outcome that is not the status it
// recorded (done_before, conflict).
func noteEnd(ctx context.Context, outcome string, status outbox.Status, msg string) {
	if n := noteOf(ctx); n != nil {
		n.outcome, n.status, n.msg = outcome, status, msg
	}
}

// errorClass is how the executor classified err.
func errorClass(err error) string {
	switch {
	case err == nil:
		return ""
	case adapters.IsUnknown(err):
		return "unknown"
	case adapters.IsRetryable(err):
		return "retryable"
	case adapters.IsPermanent(err):
		return "permanent"
	}
	return "unclassified"
}

// attempt describes how the attempt d counted ended, for its history:
// outcome, and msg as its error text (the executor's error when msg is
// empty). Nil when d counted no attempt (a resumed wait, Done, Busy).
func (r *Runtime) attempt(ctx context.Context, req adapters.Request, d idempotency.Decision, outcome, msg string) *idempotency.Attempt {
	if n := noteOf(ctx); n != nil {
		// The span's outcome, also for a delivery that counted no attempt
		// (a resumed wait, a held key).
		noteOutcome(ctx, outcome, cmp.Or(msg, errText(n.cause)))
	}
	if d.CountedAt.IsZero() {
		return nil
	}
	a := &idempotency.Attempt{Number: req.Attempt, Elapsed: time.Since(d.CountedAt), Process: r.cfg.Process,
		Outcome: outcome, Error: msg, Token: d.Token}
	if n := noteOf(ctx); n != nil {
		a.Lookup = n.lookup
		if n.cause != nil {
			a.ErrorClass = errorClass(n.cause)
			a.Error = cmp.Or(a.Error, n.cause.Error())
			var e *adapters.Error
			if errors.As(n.cause, &e) {
				a.RetryAfter = e.RetryAfter
			}
		}
	}
	return a
}

// recordAttempt records, on its own, the end of an attempt that wrote
// nothing else (a failed lookup, a lost key, a wait for proof). The
// history is not worth failing the delivery for: an error is logged.
func (r *Runtime) recordAttempt(ctx context.Context, req adapters.Request, d idempotency.Decision, outcome, msg string) {
	a := r.attempt(ctx, req, d, outcome, msg)
	if a == nil {
		return
	}
	if err := r.store.RecordAttempt(ctx, req.IntentID, *a); err != nil {
		r.cfg.Logger.Warn("adapters: record the attempt in the intent's history", "intent_id", req.IntentID, "attempt", a.Number, "error", err)
	}
}

// defaultProcess names this process: host name, process id and a random
// suffix (two processes of one pid in containers on one host differ).
func defaultProcess() string {
	host, _ := os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", cmp.Or(host, "adapter"), os.Getpid(), hex.EncodeToString(b))
}

// errText is err's text, "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
