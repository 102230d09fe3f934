package cli

import (
	"cmp"
	"context"
	"fmt"

	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// bulkCommand is `gateway retry|cancel|resolve`: the operator action on
// every intent a filter selects. Without --yes it is a dry run that says
// how many intents it would touch; with it, each is acted on in its own
// transaction and the action recorded in its history (actor "cli:$USER").
// Intents whose effect is possible are skipped and counted
// (skipped.effect_possible, and a line on stderr), by a cancel always and
// by a retry without --force; like every skip, it is not a failure (exit
// 0): the JSON says what was done.
func bulkCommand(action operator.Action) command {
	return func(ctx context.Context, a *app, args []string) int {
		fs, dbURL := a.newFlags(string(action))
		var req operator.BulkRequest
		req.Action = action
		status := fs.String("status", "", "status of the intents to "+string(action)+" (required)")
		fs.StringVar(&req.Kind, "kind", "", "only intents of this kind")
		fs.StringVar(&req.ResourcePrefix, "resource-prefix", "", "only intents whose resource starts with this")
		fs.StringVar(&req.Since, "since", "", "only intents last changed since: a duration back from now (2h) or an RFC 3339 time")
		fs.StringVar(&req.Until, "until", "", "only intents last changed before: a duration back from now or an RFC 3339 time")
		outcome := fs.String("outcome", "", "resolve's outcome: succeeded or failed")
		fs.StringVar(&req.Note, "note", "", "the reason, recorded on every intent")
		yes := fs.Bool("yes", false, "do it (without: a dry run that says how many intents it would touch)")
		if action == operator.ActionRetry {
			fs.BoolVar(&req.Force, "force", false, "retry intents whose effect is possible too (an attempt's outcome was lost: the effect may have happened), "+
				"accepting a second effect; recorded as forced in their history. Without it they are skipped: resolve records what you found at the destination")
		}
		if code, ok := a.parseOnly(fs, args); !ok {
			return code
		}
		req.Status, req.Outcome, req.DryRun = outbox.Status(*status), outbox.Status(*outcome), !*yes
		req.Actor = "cli:" + cmp.Or(a.getenv("USER"), "unknown")
		res, err := withOperator(ctx, a, *dbURL, func(op *operator.Operator) (operator.BulkResult, error) { return op.Bulk(ctx, req) })
		if err != nil {
			return a.fail(err)
		}
		a.writeJSON(res)
		if n := res.Skipped[operator.SkippedEffectPossible]; n > 0 {
			what, verb := "intents", "skipped"
			if n == 1 {
				what = "intent"
			}
			if req.DryRun {
				verb = "would be skipped"
			}
			advice := "find out at the destination and resolve them with what you found"
			if action == operator.ActionRetry {
				advice += ", or --force to accept a second effect"
			}
			fmt.Fprintf(a.stderr, "gateway %s: %d %s %s: the effect may have happened (an attempt's outcome was lost); %s\n", action, n, what, verb, advice)
		}
		return exitOK
	}
}
