package main

import "context"

// cmdLeaseHistory prints a resource's epoch history (gateway lease history).
func cmdLeaseHistory(ctx context.Context, a *app, args []string) int {
	return a.fail(badInput("command", "gateway lease history is not built yet"))
}
