package main

import "context"

// cmdRun runs the relay (and later the adapters) until SIGTERM or SIGINT.
func cmdRun(ctx context.Context, a *app, args []string) int {
	return a.fail(badInput("command", "gateway run is not built yet"))
}
