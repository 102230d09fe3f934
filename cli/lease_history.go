package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/operator"
)

// cmdLeaseHistory prints a resource's epoch history (gateway lease history):
// {"resource": R, "grants": [...]}, newest grant first; a table on a
// terminal (-o chooses).
func cmdLeaseHistory(ctx context.Context, a *app, args []string) int {
	fs, dbURL := a.newFlags("lease history")
	resource := fs.String("resource", "", "resource id")
	limit := fs.Int("limit", lease.DefaultHistoryLimit, fmt.Sprintf("most grants to print, newest first (1 to %d)", lease.MaxHistoryLimit))
	output := outputFlag(fs)
	if code, ok := a.parseOnly(fs, args); !ok {
		return code
	}
	// Check arguments before connecting, so bad input is exit 2 even when
	// the database is down.
	if err := checkResource(*resource); err != nil {
		return a.fail(err)
	}
	if *limit < 1 || *limit > lease.MaxHistoryLimit {
		return a.fail(badInput("limit", fmt.Sprintf("--limit must be between 1 and %d, got %d", lease.MaxHistoryLimit, *limit)))
	}
	table, err := a.tableOutput(output)
	if err != nil {
		return a.fail(err)
	}
	grants, err := withOperator(ctx, a, *dbURL, func(op *operator.Operator) ([]lease.Grant, error) { return op.Epochs(ctx, *resource, *limit) })
	if err != nil {
		return a.fail(err)
	}
	if table {
		writeGrantsTable(a.stdout, *resource, grants, time.Now())
		return exitOK
	}
	a.writeJSON(map[string]any{"resource": *resource, "grants": grants})
	return exitOK
}
