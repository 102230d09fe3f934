package cli

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// bulkCommand is `gateway retry|cancel|resolve`: the operator action on
// the intents named by id (actionIDs), or on every intent a filter
// selects. By filter, without --yes it is a dry run that says how many
// intents it would touch and lists the first ones; with it, each is acted
// on in its own transaction and the action recorded in its history (actor
// "cli:$USER"). Intents whose effect is possible are skipped and counted
// (skipped.effect_possible, and a line on stderr), by a cancel always and
// by a retry without --force; like every skip, it is not a failure (exit
// 0): the JSON says what was done.
func bulkCommand(action operator.Action) command {
	return func(ctx context.Context, a *app, args []string) int {
		fs, dbURL := a.newFlags(string(action))
		var req operator.BulkRequest
		req.Action = action
		status := fs.String("status", "", "status of the intents to "+string(action)+" (required without intent ids)")
		fs.StringVar(&req.Kind, "kind", "", "only intents of this kind")
		fs.StringVar(&req.Resource, "resource", "", "only intents of this resource (its exact name)")
		fs.StringVar(&req.ResourcePrefix, "resource-prefix", "", "only intents whose resource starts with this")
		fs.StringVar(&req.Since, "since", "", "only intents last changed since: a duration back from now (2h) or an RFC 3339 time")
		fs.StringVar(&req.Until, "until", "", "only intents last changed before: a duration back from now or an RFC 3339 time")
		outcome := fs.String("outcome", "", "resolve's outcome: succeeded or failed")
		fs.StringVar(&req.Note, "note", "", "the reason, recorded on every intent")
		yes := fs.Bool("yes", false, "do it (without: a dry run that says how many intents it would touch and lists the first); intents named by id are acted on without it")
		if action == operator.ActionRetry {
			fs.BoolVar(&req.Force, "force", false, "retry intents whose effect is possible too (an attempt's outcome was lost: the effect may have happened), "+
				"accepting a second effect; recorded as forced in their history. Without it they are skipped: resolve records what you found at the destination")
		}
		ids, code, ok := a.parseInterleaved(fs, args)
		if !ok {
			return code
		}
		req.Status, req.Outcome, req.DryRun = outbox.Status(*status), outbox.Status(*outcome), !*yes
		req.Actor = "cli:" + cmp.Or(a.getenv("USER"), "unknown")
		if len(ids) > 0 {
			return a.actionIDs(ctx, fs, *dbURL, ids, operator.ActionRequest{Action: action, Actor: req.Actor, Outcome: req.Outcome, Note: req.Note, Force: req.Force})
		}
		// Bad input is refused before connecting (exit 2 whatever the
		// database), with the rules of the run whether or not this is a
		// dry run: a dry run must not plan what --yes would refuse. Only a
		// dry run's resolve may leave --outcome out (it counts, as the
		// API's and the pages' preview does); with --yes it is required.
		if action == operator.ActionResolve && req.Outcome == "" && !req.DryRun {
			return a.fail(badInput("outcome", "gateway resolve needs --outcome succeeded or failed: what you found at the destination"))
		}
		if err := req.Validate(); err != nil {
			return a.fail(err)
		}
		res, err := withOperator(ctx, a, *dbURL, func(op *operator.Operator) (operator.BulkResult, error) { return op.Bulk(ctx, req) })
		if err != nil {
			return a.fail(err)
		}
		a.writeJSON(res)
		if req.DryRun {
			a.sayDryRun(action, res)
		}
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

// sayDryRun tells a person on stderr what a dry run found: how many
// intents the action would touch, the first ones, and how to do it.
func (a *app) sayDryRun(action operator.Action, res operator.BulkResult) {
	n := res.Matched - res.Skipped[operator.SkippedEffectPossible]
	if n <= 0 {
		fmt.Fprintf(a.stderr, "gateway %s: a dry run: no intent to %s\n", action, action)
		return
	}
	ids := make([]string, len(res.IDs))
	for i, id := range res.IDs {
		ids[i] = strconv.FormatInt(id, 10)
	}
	list := strings.Join(ids, " ")
	if n > len(res.IDs) {
		list = fmt.Sprintf("first %d: %s …", len(res.IDs), list)
	}
	what := "intents"
	if n == 1 {
		what = "intent"
	}
	fmt.Fprintf(a.stderr, "gateway %s: a dry run: %d %s to %s (%s); nothing changed: add --yes to do it\n", action, n, what, action, list)
}
