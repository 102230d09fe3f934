package main

import "context"

// cmdBench runs the benchmarks next to their raw baselines (gateway bench).
func cmdBench(ctx context.Context, a *app, args []string) int {
	return a.fail(badInput("command", "gateway bench is not built yet"))
}
