package cli

import (
	"context"
	"time"

	"github.com/fencegate/fencegate/operator"
)

// cmdLs lists intents, newest first, with the same query and the same
// pagination as GET /api/v1/intents (gateway ls): a table on a terminal,
// the page's JSON otherwise (-o chooses).
func cmdLs(ctx context.Context, a *app, args []string) int {
	fs, dbURL := a.newFlags("ls")
	status := fs.String("status", "", "only intents with this status (pending, relayed, succeeded, failed, superseded, unknown, cancelled)")
	resource := fs.String("resource", "", "only intents of this resource")
	kind := fs.String("kind", "", "only intents of this kind")
	limit := fs.String("limit", "", "page size, 1 to 500 (default 50)")
	cursor := fs.String("cursor", "", "next_cursor of the previous page")
	output := outputFlag(fs)
	if code, ok := a.parseOnly(fs, args); !ok {
		return code
	}
	// Bad filters are refused before connecting: exit 2 either way.
	f, err := operator.ParseListFilter(*resource, *status, *kind, *limit, *cursor)
	if err != nil {
		return a.fail(err)
	}
	table, err := a.tableOutput(output)
	if err != nil {
		return a.fail(err)
	}
	page, err := withOperator(ctx, a, *dbURL, func(op *operator.Operator) (operator.Page, error) { return op.List(ctx, f) })
	if err != nil {
		return a.fail(err)
	}
	if table {
		writeIntentsTable(a.stdout, page, time.Now())
		return exitOK
	}
	a.writeJSON(page)
	return exitOK
}
