package gateway_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/gateway"
	"github.com/fencegate/fencegate/idempotency"
)

// A program of its own running what `gateway run --adapters file` runs:
// the relay, the file adapter under the adapter runtime, the idempotency
// store with group commit, both sweepers and the admin API and pages.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("GATEWAY_DATABASE_URL")) // migrated: gateway migrate
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	nc, err := nats.Connect(nats.DefaultURL) // JetStream enabled
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()

	// One registration per adapter: its kind, its intake rules (here the
	// target policy) and its executor, from the adapter itself.
	reg := gateway.NewRegistry()
	f, err := file.New(file.Config{Root: "/srv/reports", Registerer: reg})
	if err != nil {
		fmt.Println(err)
		return
	}
	g, err := gateway.New(pool, nc, gateway.Config{
		Schema:      os.Getenv("GATEWAY_SCHEMA"), // as migrated ("": fencegate)
		Dispatcher:  &dispatcher.Config{},        // the relay, with its defaults
		Adapters:    []adapters.Registration{f.Registration()},
		Idempotency: idempotency.Config{GroupCommit: true},
		Registry:    reg,
		AdminAddr:   "127.0.0.1:8080",
	})
	if err != nil {
		fmt.Println(err) // a bad configuration, naming the field
		return
	}
	if err := g.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer g.Stop() // in-flight executions finish, claims go back
	select {
	case <-ctx.Done():
	case <-g.Stopped():
		fmt.Println(g.Cause(), "stopped unexpectedly")
	}
}
