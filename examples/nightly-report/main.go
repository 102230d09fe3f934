// Command nightly-report is the article's worker, as a program to copy: it
// takes the lease on the nightly report (a new, higher epoch — its fencing
// token), builds the report, and in one transaction enqueues both of its
// side effects under that epoch: the email to the readers and the report
// file to publish. A worker that lost its lease meanwhile (paused past its
// TTL, a takeover) is refused with stale_epoch and stores nothing; a rerun
// of the same day after a lost response finds its intents already
// committed.
//
//	gateway migrate && go run ./examples/nightly-report --database-url URL --day 2026-12-01
//
// `gateway run` (or `gateway dev`) then relays and executes the intents:
// the email once per business key, the file published only if no newer
// epoch published it first.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Result is what the program prints: the epoch it worked under and its
// intents.
type Result struct {
	Resource string          `json:"resource"`
	Epoch    int64           `json:"epoch"`
	Intents  []outbox.Result `json:"intents"`
}

func main() {
	dbURL := flag.String("database-url", os.Getenv("GATEWAY_DATABASE_URL"), "PostgreSQL URL (migrated with `gateway migrate`)")
	schema := flag.String("schema", os.Getenv("GATEWAY_SCHEMA"), "fencegate's schema (gateway migrate --schema; default $GATEWAY_SCHEMA, else fencegate)")
	day := flag.String("day", time.Now().UTC().Format("2006-01-02"), "the report's day")
	holder := flag.String("holder", "nightly-"+hostname(), "this worker's name")
	to := flag.String("mail-to", "readers@example.com", "who gets the report")
	flag.Parse()
	ctx := context.Background()
	res, err := run(ctx, *dbURL, *schema, *day, *holder, *to)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nightly-report:", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

func run(ctx context.Context, dbURL, schema, day, holder, to string) (*Result, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	lease.RequirePrimary(cfg) // epochs come from the primary, never a replica
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	const resource = "nightly-report"
	// The Keeper renews every TTL/3 and cancels k.Context() once the lease
	// can no longer be trusted: work under that context.
	issuer := lease.NewIssuer(pool, lease.WithSchema(schema))
	k, err := issuer.Hold(ctx, resource, holder, lease.KeeperConfig{TTL: 30 * time.Second})
	if err != nil {
		return nil, err // *lease.HeldError: another worker holds it
	}
	defer k.Stop()

	report := fmt.Sprintf("Nightly report for %s\n\n(figures…)\n", day)
	mail, _ := json.Marshal(map[string]any{"to": to, "from": "reports@example.com",
		"subject": "Nightly report " + day, "text": report})
	file, _ := json.Marshal(map[string]any{"target": "reports/" + day + ".txt", "content": report})

	// Both effects in one transaction, each fenced by the epoch: either both
	// are committed while this worker holds the lease, or neither is.
	tx, err := pool.Begin(k.Context())
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // a no-op after Commit
	out := &Result{Resource: resource, Epoch: k.Epoch()}
	for _, in := range []outbox.Intent{
		// The business key of the email: one message per day, whoever sends it.
		{Resource: resource, Epoch: k.Epoch(), OperationID: "mail-" + day, Kind: "email", IdempotencyKey: "report-mail/" + day, Payload: mail},
		{Resource: resource, Epoch: k.Epoch(), OperationID: "file-" + day, Kind: "file", IdempotencyKey: "report-file/" + day, Payload: file},
	} {
		r, err := ob.EnqueueTx(k.Context(), tx, in)
		if err != nil {
			return nil, err // *outbox.StaleEpochError after a takeover: nothing stored
		}
		out.Intents = append(out.Intents, r)
	}
	if err := tx.Commit(k.Context()); err != nil {
		return nil, err
	}
	// Done: stop renewing and hand the lease back, so the next worker need
	// not wait out the TTL (if this fails, the lease simply expires).
	k.Stop()
	if err := issuer.Release(ctx, resource, holder, k.Epoch()); err != nil {
		fmt.Fprintln(os.Stderr, "nightly-report: release the lease:", err)
	}
	return out, nil
}
