// Command gateway is fencegate's one binary: schema migrations, the lease and
// epoch issuer, fenced enqueue and status lookups for workers and operators,
// and the long-running relay and adapter processes. It is package cli with
// the built-in kinds; see `gateway --help` and docs/cli.md.
//
// Every command that writes JSON writes one JSON object on stdout. Exit codes:
// 0 ok, 1 internal error or a dependency unavailable, 2 bad input (nothing
// stored), 3 stale epoch (fenced out), 4 lease held by another holder,
// 5 conflict (an operation id or idempotency key reused with other content).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fencegate/fencegate/cli"
	"github.com/fencegate/fencegate/internal/otelsetup"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// Tracing is off unless the standard OTEL_* variables ask for it.
	shutdown, err := otelsetup.Setup(ctx, os.Getenv, "fencegate-gateway")
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway: tracing disabled: %v\n", err)
		shutdown = func(context.Context) error { return nil }
	}
	code := cli.Main(ctx, os.Args[1:], cli.Options{})
	stop()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = shutdown(sctx) // flush spans
	cancel()
	os.Exit(code)
}
