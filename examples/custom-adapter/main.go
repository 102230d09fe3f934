// Command custom-adapter is an example program with an adapter of its own:
// kind "notify", which posts a notification to an HTTP service that
// deduplicates on Idempotency-Key and answers lookups by key (notify.go).
// It is two programs in one:
//
// With a gateway command first it is a whole gateway binary that knows the
// kind (package cli): the same commands and flags as `gateway`, with notify
// enqueueable, runnable (--adapters notify; the service's URL from
// $NOTIFY_ENDPOINT) and listed on the pages:
//
//	go run ./examples/custom-adapter run --adapters notify --admin-addr 127.0.0.1:8080
//	go run ./examples/custom-adapter enqueue --resource ops-digest --epoch N --op d-1 \
//		--kind notify --payload '{"channel":"ops","text":"ready"}'
//
// With flags only it wires the pieces itself through the composition root
// (package gateway) — the relay, the adapter runtime, the idempotency
// store — around that one kind, and enqueues one intent as a worker would,
// under a lease:
//
//	go run ./examples/custom-adapter --database-url URL --nats-url URL --endpoint http://127.0.0.1:9000
//
// The adapter passes the conformance suite (adaptertest) in main_test.go,
// which is how to prove one of your own.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/cli"
	"github.com/fencegate/fencegate/gateway"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

func main() {
	if len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-") {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := cli.Main(ctx, os.Args[1:], cliOptions(cmp.Or(os.Getenv("NOTIFY_ENDPOINT"), "http://127.0.0.1:9000")))
		stop()
		os.Exit(code)
	}
	dbURL := flag.String("database-url", os.Getenv("GATEWAY_DATABASE_URL"), "PostgreSQL URL (migrated with `gateway migrate`)")
	schema := flag.String("schema", os.Getenv("GATEWAY_SCHEMA"), "fencegate's schema (gateway migrate --schema; default $GATEWAY_SCHEMA, else fencegate)")
	natsURL := flag.String("nats-url", nats.DefaultURL, "NATS URL (JetStream enabled)")
	endpoint := flag.String("endpoint", "http://127.0.0.1:9000", "the notification service")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dbURL, *schema, *natsURL, *endpoint); err != nil {
		fmt.Fprintln(os.Stderr, "custom-adapter:", err)
		os.Exit(1)
	}
}

// cliOptions registers the adapter with the gateway command line: its
// spec for enqueue and the intake, its executor for run.
func cliOptions(endpoint string) cli.Options {
	return cli.Options{Adapters: []adapters.Registration{Registration(endpoint)}}
}

func run(ctx context.Context, dbURL, schema, natsURL, endpoint string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()

	// The worker's outbox client knows the kind, with its payload's
	// rules, next to the built-in ones.
	kinds := outbox.DefaultKinds()
	kinds[Kind] = KindSpec()
	ob, err := outbox.New(pool, outbox.Config{Schema: schema, Kinds: kinds, Logger: log})
	if err != nil {
		return err
	}
	// The composition root runs what `gateway run` runs — the relay, the
	// adapter runtime with group commit, the sweepers — with this kind's
	// adapter as the only one.
	g, err := gateway.Start(ctx, gateway.Config{
		Schema:        schema,
		Pool:          pool,
		NC:            nc,
		RunDispatcher: true,
		Adapters:      []adapters.Registration{Registration(endpoint)},
		Idempotency:   idempotency.Config{GroupCommit: true},
		Logger:        log,
	})
	if err != nil {
		return err
	}
	defer g.Stop()

	// A worker: take the lease, enqueue with its epoch.
	l, err := lease.NewIssuer(pool, lease.WithSchema(schema)).Acquire(ctx, "ops-digest", "custom-adapter-example", time.Minute)
	if err != nil {
		return err
	}
	payload, _ := json.Marshal(Payload{Channel: "ops", Text: "nightly digest is ready"})
	r, err := ob.Enqueue(ctx, outbox.Intent{Resource: "ops-digest", Epoch: l.Epoch,
		OperationID: "digest-" + time.Now().UTC().Format("2006-01-02"), Kind: Kind, Payload: payload})
	if err != nil {
		return err
	}
	log.Info("enqueued", "intent_id", r.IntentID, "duplicate", r.Duplicate, "epoch", l.Epoch)
	select {
	case <-ctx.Done():
	case <-g.Stopped():
		return fmt.Errorf("%s stopped unexpectedly", g.Cause())
	}
	if errors.Is(context.Cause(ctx), context.Canceled) {
		return nil
	}
	return ctx.Err()
}
