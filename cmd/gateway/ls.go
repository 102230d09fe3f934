package main

import "context"

// cmdLs lists intents (gateway ls).
func cmdLs(ctx context.Context, a *app, args []string) int {
	return a.fail(badInput("command", "gateway ls is not built yet"))
}
