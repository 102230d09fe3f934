package cli

import (
	"cmp"
	"context"

	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/outbox"
)

// bulkCommand is `gateway retry|cancel|resolve`: the operator action on
// every intent a filter selects. Without --yes it is a dry run that says
// how many intents it would touch; with it, each is acted on in its own
// transaction and the action recorded in its history (actor "cli:$USER").
func bulkCommand(action admin.Action) command {
	return func(ctx context.Context, a *app, args []string) int {
		fs, dbURL := a.newFlags(string(action))
		var req admin.BulkRequest
		req.Action = action
		status := fs.String("status", "", "status of the intents to "+string(action)+" (required)")
		fs.StringVar(&req.Kind, "kind", "", "only intents of this kind")
		fs.StringVar(&req.ResourcePrefix, "resource-prefix", "", "only intents whose resource starts with this")
		fs.StringVar(&req.Since, "since", "", "only intents last changed since: a duration back from now (2h) or an RFC 3339 time")
		fs.StringVar(&req.Until, "until", "", "only intents last changed before: a duration back from now or an RFC 3339 time")
		outcome := fs.String("outcome", "", "resolve's outcome: succeeded or failed")
		fs.StringVar(&req.Note, "note", "", "the reason, recorded on every intent")
		yes := fs.Bool("yes", false, "do it (without: a dry run that says how many intents it would touch)")
		if code, ok := a.parse(fs, args); !ok {
			return code
		}
		if err := noArgs(fs); err != nil {
			return a.fail(err)
		}
		req.Status, req.Outcome, req.DryRun = outbox.Status(*status), outbox.Status(*outcome), !*yes
		req.Actor = "cli:" + cmp.Or(a.getenv("USER"), "unknown")
		pool, err := a.connect(ctx, *dbURL)
		if err != nil {
			return a.fail(err)
		}
		defer pool.Close()
		res, err := admin.Bulk(ctx, pool, a.schema(), req)
		if err != nil {
			return a.fail(err)
		}
		a.writeJSON(res)
		return exitOK
	}
}
