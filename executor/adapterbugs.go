package executor

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/outbox"
)

// An executor that breaks the SPI — panics, or reports an Outcome that
// adapters.Outcome does not allow — does so after its attempt began the
// intent's idempotency key, so the effect may have happened. What the
// runtime records then must be true whatever the adapter did: it is never
// left unrecorded (the key would stay started until its lock expired, the
// intent relayed with effect none, then "abandoned"), never recorded as a
// failure, and never kills the process with every other adapter in it.

// adapterBugError is an executor's breach of the SPI met after its key was
// begun (a panic in Execute or Lookup, a status Execute may not return).
// Execute's is taken as an unknown outcome, as an error the executor did
// not classify is; it was logged at ERROR where it was met. Its text is
// the intent's last_error.
type adapterBugError struct{ msg string }

func (e *adapterBugError) Error() string { return e.msg }

// callExecute calls ex.Execute and recovers a panic in it: the key was
// begun, so the effect may have happened, and the outcome is unknown — an
// *adapterBugError ("adapter panicked: <value>"), looked up where the
// executor declares Lookup, held for an operator otherwise (or resent
// where the destination dedups on the key), like any error the executor
// did not classify. The stack is logged at ERROR. net/http isolates a
// handler's panic the same way: one adapter's bug no longer stops the
// relay and every other adapter of the process.
func (r *Runtime) callExecute(ctx context.Context, ex adapters.Executor, req adapters.Request, log *slog.Logger) (out adapters.Outcome, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &adapterBugError{msg: fmt.Sprintf("adapter panicked: %v", p)}
			out = adapters.Outcome{}
			r.m.outcomes.WithLabelValues(ex.Kind(), "adapter_panic").Inc()
			log.Error("adapters: the executor's Execute panicked; taken as an unknown outcome (the effect may have happened)",
				"attempt", req.Attempt, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
	}()
	return ex.Execute(ctx, req)
}

// callLookup calls l.Lookup and recovers a panic in it as a failed lookup
// (an *adapterBugError): nothing is decided, the key stays owned and the
// intent is looked up again, as after any lookup error.
func (r *Runtime) callLookup(ctx context.Context, ex adapters.Executor, l adapters.Looker, req adapters.Request, log *slog.Logger) (out adapters.Outcome, found bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, found, err = adapters.Outcome{}, false, &adapterBugError{msg: fmt.Sprintf("adapter's Lookup panicked: %v", p)}
			r.m.outcomes.WithLabelValues(ex.Kind(), "adapter_panic").Inc()
			log.Error("adapters: the executor's Lookup panicked; taken as a failed lookup",
				"attempt", req.Attempt, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
	}()
	return l.Lookup(ctx, req)
}

// checkOutcome checks the Outcome that Execute returned with no error.
//
// Its Status must be succeeded (or empty, which means it) or superseded
// (adapters.Outcome). Any other — failed, unknown, a word of its own — is
// a report the runtime cannot take at its word: a failure is a
// PermanentError, which says the effect did not happen, and "failed" with
// no error says nothing of the kind; the key was begun, so the effect may
// have happened. It is an *adapterBugError, taken as an unknown outcome
// (looked up, or held with effect possible), never recorded as failed.
//
// Its Result must be a JSON object (empty or null: none). One that is not
// — "not json", an array, a bare string — used to be refused by the
// idempotency store when recorded, so nothing was recorded: the intent
// stayed relayed with effect none, every redelivery found the key busy,
// and after the key's lock timeout it was held as "abandoned" — an
// effect the adapter had reported done, shown as one that never ran.
//
// The status the adapter reported stands, with the result replaced by a
// JSON object that says what the adapter returned ({"invalid_result":
// "<its first bytes, as a string>", …}) and a last_error that names the
// adapter bug. Recording it unknown instead would hold for an operator an
// effect whose adapter said, with no error, that it happened (or that the
// destination fenced it out) — the one thing the runtime knows of it; a
// malformed description of the effect says nothing against that report,
// and the runtime takes an adapter's word for the status of every other
// effect. Nothing recorded is then false: the status is the adapter's
// report, the result says it is not the adapter's result, last_error says
// why.
func (r *Runtime) checkOutcome(ex adapters.Executor, req adapters.Request, out adapters.Outcome, log *slog.Logger) (adapters.Outcome, string, error) {
	out.Status = cmp.Or(out.Status, outbox.StatusSucceeded)
	switch out.Status {
	case outbox.StatusSucceeded, outbox.StatusSuperseded:
	default:
		msg := fmt.Sprintf("adapter bug: Execute returned status %q and no error (an Outcome's Status is succeeded or superseded; "+
			"a failure is a PermanentError): taken as an unknown outcome, the effect may have happened", out.Status)
		r.m.outcomes.WithLabelValues(ex.Kind(), "adapter_bad_outcome").Inc()
		log.Error("adapters: "+msg, "attempt", req.Attempt, "result", head(out.Result))
		return adapters.Outcome{}, "", &adapterBugError{msg: msg}
	}
	res, ok := objectResult(out.Result)
	if ok {
		out.Result = res
		return out, "", nil
	}
	msg := fmt.Sprintf("adapter bug: Execute returned a result that is not a JSON object; recorded %s as the adapter reported it, "+
		"the result replaced by invalid_result", out.Status)
	r.m.outcomes.WithLabelValues(ex.Kind(), "adapter_bad_outcome").Inc()
	log.Error("adapters: "+msg, "attempt", req.Attempt, "status", out.Status, "result", head(out.Result))
	out.Result = res
	return out, msg, nil
}

// checkFound is checkOutcome for an outcome a Lookup found. A result that
// is not a JSON object would be refused when recorded, and the key left
// owned: it is replaced, the status the lookup found standing. A status
// is one the store records: succeeded (also when empty, as from Execute),
// failed, superseded, or unknown (held). Another (relayed, a typo) was
// refused when recorded and left the intent relayed until the key's lock
// expired: the lookup did find a trace, so the effect may have happened,
// and the outcome becomes unknown, held for an operator, with note saying
// why (empty when the status is fine).
func (r *Runtime) checkFound(ex adapters.Executor, out adapters.Outcome, log *slog.Logger) (_ adapters.Outcome, note string) {
	res, ok := objectResult(out.Result)
	if !ok {
		log.Error("adapters: adapter bug: Lookup returned a result that is not a JSON object; recording it replaced by invalid_result",
			"status", out.Status, "result", head(out.Result))
		r.m.outcomes.WithLabelValues(ex.Kind(), "adapter_bad_outcome").Inc()
	}
	out.Result = res
	out.Status = cmp.Or(out.Status, outbox.StatusSucceeded)
	switch out.Status {
	case outbox.StatusSucceeded, outbox.StatusFailed, outbox.StatusSuperseded, outbox.StatusUnknown:
		return out, ""
	}
	note = fmt.Sprintf("adapter bug: Lookup returned status %q (a found outcome is succeeded, failed, superseded or unknown): "+
		"held for an operator, the effect may have happened", out.Status)
	log.Error("adapters: "+note, "result", head(out.Result))
	r.m.outcomes.WithLabelValues(ex.Kind(), "adapter_bad_outcome").Inc()
	out.Status = outbox.StatusUnknown
	return out, note
}

// maxInvalidResult is how many bytes of a result that is not a JSON
// object are kept (as a string) in the object that replaces it.
const maxInvalidResult = 256

// objectResult returns res when it is a JSON object, nil when it is empty
// or null (no result), and otherwise, with ok false, a JSON object that
// replaces it: {"invalid_result": its first maxInvalidResult bytes as a
// string (invalid UTF-8 replaced), "invalid_result_bytes": its length}.
func objectResult(res json.RawMessage) (_ json.RawMessage, ok bool) {
	t := bytes.TrimSpace(res)
	if len(t) == 0 || string(t) == "null" {
		return nil, true
	}
	if t[0] == '{' && json.Valid(t) {
		return res, true
	}
	b, _ := json.Marshal(struct {
		Invalid string `json:"invalid_result"`
		Bytes   int    `json:"invalid_result_bytes"`
	}{head(res), len(res)})
	return b, false
}

// head is the first maxInvalidResult bytes of b, as valid UTF-8.
func head(b []byte) string {
	if len(b) > maxInvalidResult {
		b = b[:maxInvalidResult]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
