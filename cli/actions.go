package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"

	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/operator"
)

// parseInterleaved is parse for a command that takes positional arguments
// among its flags (gateway retry 42 --note N 43): it returns the
// positional ones in order.
func (a *app) parseInterleaved(fs *flag.FlagSet, args []string) ([]string, int, bool) {
	var pos []string
	for {
		if code, ok := a.parse(fs, args); !ok {
			return nil, code, false
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, 0, true
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// bulkFilters are the flags that select intents for a bulk action: with
// intent ids they have no meaning.
var bulkFilters = []string{"status", "kind", "resource", "resource-prefix", "since", "until"}

// actionIDs is `gateway retry|cancel|resolve ID…`: the action on each
// intent named, in the order given, each in its own transaction recorded
// in the intent's history (operator.Apply, as POST
// /api/v1/intents/{id}/ACTION). It prints {"results": [...]}, one entry
// per id: what the action did (operator.ActionResult), or
// {"intent_id","action","error"} with the error object of the contract.
// Every id is tried; the exit code is 0 when every action was done, else
// that of the first that was not (2 not_found, 5 invalid_state: the
// intent's status does not allow it), with a line on stderr for each.
// Input is checked before connecting: a bad id or flag acts on none (exit
// 2).
func (a *app) actionIDs(ctx context.Context, fs *flag.FlagSet, dbURL string, args []string, req operator.ActionRequest) int {
	var ids []int64
	for _, arg := range args {
		id, err := strconv.ParseInt(arg, 10, 64)
		if err != nil || id < 1 {
			return a.fail(badInput("intent_id", fmt.Sprintf("an intent id is a positive integer, got %q", arg)))
		}
		// The same id twice is acted on once: the second would only be
		// refused for the status the first gave it.
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	var filter string
	fs.Visit(func(f *flag.Flag) {
		if filter == "" && slices.Contains(bulkFilters, f.Name) {
			filter = f.Name
		}
	})
	if filter != "" {
		return a.fail(badInput("intent_id", fmt.Sprintf("give intent ids or --status and filters, not both (--%s with ids)", filter)))
	}
	if req.Action == operator.ActionResolve && req.Outcome == "" {
		return a.fail(badInput("outcome", "gateway resolve needs --outcome succeeded or failed: what you found at the destination"))
	}
	req.IntentID = ids[0]
	if err := req.Validate(); err != nil {
		return a.fail(err)
	}
	type failure struct {
		id  int64
		err *cliError
	}
	var failures []failure
	results, err := withOperator(ctx, a, dbURL, func(op *operator.Operator) ([]any, error) {
		results := make([]any, 0, len(ids))
		for _, id := range ids {
			req.IntentID = id
			res, err := op.Apply(ctx, req)
			if err != nil {
				ce := actionError(err)
				failures = append(failures, failure{id, ce})
				results = append(results, map[string]any{"intent_id": id, "action": req.Action, "error": ce.Body()})
				continue
			}
			results = append(results, res)
		}
		return results, nil
	})
	if err != nil {
		return a.fail(err)
	}
	a.writeJSON(map[string]any{"results": results})
	for _, f := range failures {
		fmt.Fprintf(a.stderr, "gateway %s: intent %d: %s\n", req.Action, f.id, oneLine(f.err.Message))
	}
	if len(failures) > 0 {
		return failures[0].err.Exit()
	}
	return exitOK
}

// actionError maps an error of operator.Apply to the contract: an
// *operator.InvalidStateError is invalid_state with the fields the admin
// API's 409 has (intent_id, action, status, allowed; in_flight; field
// "effect" and effect when the effect may have happened); the rest as
// every command maps them (not_found, invalid_input, unavailable, …).
func actionError(err error) *cliError {
	var ise *operator.InvalidStateError
	if !errors.As(err, &ise) {
		return classify(err)
	}
	extra := map[string]any{"intent_id": ise.IntentID, "action": ise.Action, "status": ise.Status, "allowed": ise.Allowed}
	e := &cliError{Code: errmap.InvalidState, Message: err.Error(), Extra: extra}
	if ise.InFlight {
		extra["in_flight"] = true
	}
	if ise.Effect != "" {
		e.Field = "effect"
		extra["effect"] = ise.Effect
	}
	return e
}
