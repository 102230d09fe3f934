package main

import "context"

// cmdDev runs the whole system in one process (gateway dev).
func cmdDev(ctx context.Context, a *app, args []string) int {
	return a.fail(badInput("command", "gateway dev is not built yet"))
}
