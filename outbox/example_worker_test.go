package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// schema is the schema fencegate was migrated into (gateway migrate
// --schema; "" is the default, fencegate): here the test's.
var schema = testdb.Schema()

// sendNightlyReport is the Go worker of the README, word for word (the
// README's copy is checked against this function by internal/doccheck): it
// takes the lease on the nightly report and, in one transaction, records
// the report as sent and enqueues its email, fenced by the lease's epoch.
func sendNightlyReport(ctx context.Context, pool *pgxpool.Pool, day string) error {
	issuer := lease.NewIssuer(pool, lease.WithSchema(schema))
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	// A new, higher epoch. The Keeper renews the lease every TTL/3 and
	// cancels its context once the lease can no longer be trusted.
	k, err := issuer.Hold(ctx, "nightly-report", "worker-a", lease.KeeperConfig{TTL: 10 * time.Second})
	if err != nil {
		return err // *lease.HeldError: another holder's lease is live
	}
	defer k.Stop()

	tx, err := pool.Begin(k.Context())
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // a no-op after Commit
	if _, err := tx.Exec(k.Context(), `UPDATE reports SET sent_at = now() WHERE day = $1`, day); err != nil {
		return err
	}
	_, err = ob.EnqueueTx(k.Context(), tx, outbox.Intent{
		Resource: "nightly-report", Epoch: k.Epoch(), OperationID: "report-" + day, Kind: "email",
		Payload: json.RawMessage(`{"to":"alice@example.com","from":"reports@example.com","subject":"Nightly report","text":"…"}`),
	})
	if err != nil {
		return err // *outbox.StaleEpochError if taken over: nothing of tx is stored
	}
	return tx.Commit(k.Context())
}

// Example_worker runs the README's Go worker against the PostgreSQL in
// GATEWAY_DATABASE_URL (migrated by `gateway migrate`, with a reports table
// of its own). It has no Output line: `go test` compiles it and does not
// run it; TestExampleWorker runs the worker against a test database.
func Example_worker() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("GATEWAY_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	lease.RequirePrimary(cfg) // epochs come from the primary, never a replica
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := sendNightlyReport(ctx, pool, "2026-12-01"); err != nil {
		log.Fatal(err)
	}
}

// TestExampleWorker runs the README's worker: the business row and the
// intent commit together, at the epoch the lease was granted; a second run
// (a retry of the same day) gets a new epoch and finds its intent already
// committed, so nothing new is stored; once another holder took over, the
// worker is refused before it writes anything.
func TestExampleWorker(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE reports (day text PRIMARY KEY, sent_at timestamptz);
		INSERT INTO reports (day) VALUES ('2026-12-01')`); err != nil {
		t.Fatal(err)
	}
	if err := sendNightlyReport(ctx, pool, "2026-12-01"); err != nil {
		t.Fatal(err)
	}
	var epoch int64
	var sent bool
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT i.epoch, r.sent_at IS NOT NULL FROM fencegate.intents i, reports r
		WHERE i.resource_id = 'nightly-report' AND i.operation_id = 'report-2026-12-01' AND r.day = '2026-12-01'`)).Scan(&epoch, &sent); err != nil {
		t.Fatal(err)
	}
	if !sent {
		t.Fatal("the report's row was not updated with the intent")
	}
	issuer := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()))
	res, err := issuer.Get(ctx, "nightly-report")
	if err != nil {
		t.Fatal(err)
	}
	if epoch != res.Epoch {
		t.Fatalf("intent epoch %d, resource epoch %d", epoch, res.Epoch)
	}

	// The same day again: worker-a holds the lease, acquires again (a new
	// epoch), and the operation id answers with the committed intent.
	if err := sendNightlyReport(ctx, pool, "2026-12-01"); err != nil {
		t.Fatal(err)
	}
	if n := countIntents(t, pool, "resource_id = 'nightly-report'"); n != 1 {
		t.Fatalf("%d intents after a second run, want 1", n)
	}

	// Another holder took over after worker-a's lease expired: worker-a's
	// next run is refused before it writes anything.
	expire(t, pool, "nightly-report")
	if _, err := issuer.Acquire(ctx, "nightly-report", "worker-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO reports (day) VALUES ('2026-12-02')`); err != nil {
		t.Fatal(err)
	}
	err = sendNightlyReport(ctx, pool, "2026-12-02")
	var held *lease.HeldError
	if !errors.As(err, &held) || held.Holder != "worker-b" {
		t.Fatalf("worker-a while worker-b holds the lease: %v, want a *lease.HeldError naming worker-b", err)
	}
	if n := countIntents(t, pool, "resource_id = 'nightly-report'"); n != 1 {
		t.Fatalf("%d intents after a refused run, want 1", n)
	}
}
