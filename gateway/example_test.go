package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/gateway"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// A program of its own running what `gateway run --adapters file` runs:
// the relay, the file adapter under the adapter runtime, the idempotency
// store with group commit, both sweepers and the admin API and pages. A
// worker's intent to write a report goes through it once.
func Example() {
	ctx := context.Background()
	// A migrated database, a JetStream server and a directory of the
	// example's own; a program opens GATEWAY_DATABASE_URL (migrated by
	// gateway migrate), its NATS (nats.DefaultURL) and, say, /srv/reports.
	tb := testdb.ExampleTB()
	schema := testdb.Schema() // as migrated ("": fencegate)
	pool, err := pgxpool.New(ctx, testdb.NewURL(tb))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	nc, err := nats.Connect(natstest.Start(tb).URL) // JetStream enabled
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	root := tb.TempDir()

	// One registration per adapter: its kind, its intake rules (here the
	// target policy) and its executor, from the adapter itself.
	reg := gateway.NewRegistry()
	f, err := file.New(file.Config{Root: root, Registerer: reg})
	if err != nil {
		fmt.Println(err)
		return
	}
	g, err := gateway.New(pool, nc, gateway.Config{
		Schema:      schema,
		Dispatcher:  &dispatcher.Config{}, // the relay, with its defaults
		Adapters:    []adapters.Registration{f.Registration()},
		Idempotency: idempotency.Config{GroupCommit: true},
		Registry:    reg,
		AdminAddr:   "127.0.0.1:0",
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

	// A worker, under its lease, enqueues the intent and waits for its
	// outcome.
	l, err := lease.NewIssuer(pool, lease.WithSchema(schema)).Acquire(ctx, "nightly-report", "worker-a", time.Minute)
	if err != nil {
		fmt.Println(err)
		return
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := ob.Enqueue(ctx, outbox.Intent{Resource: "nightly-report", Epoch: l.Epoch, OperationID: "report-2026-12-01",
		Kind: file.Kind, Payload: json.RawMessage(`{"target":"reports/2026-12-01.txt","content":"all good"}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rec, err := ob.Wait(wctx, res.IntentID)
	if err != nil {
		fmt.Println(err)
		return
	}
	content, err := os.ReadFile(filepath.Join(root, "reports", "2026-12-01.txt"))
	fmt.Printf("%s: %q, %v\n", rec.Status, content, err)
	select {
	case <-g.Stopped():
		fmt.Println(g.Cause(), "stopped unexpectedly")
	default:
	}
	// Output:
	// succeeded: "all good", <nil>
}
