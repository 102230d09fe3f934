package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
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

// Example_worker runs the README's Go worker: the business row and the
// intent commit together, at the epoch the lease was granted; a second run
// (a retry of the same day) gets a new epoch and finds its intent already
// committed, so nothing new is stored; while another holder has the lease,
// the worker is refused before it writes anything.
func Example_worker() {
	ctx := context.Background()
	// A migrated database of the example's own; a program opens
	// GATEWAY_DATABASE_URL (migrated by gateway migrate).
	cfg, err := pgxpool.ParseConfig(testdb.NewURL(testdb.ExampleTB()))
	if err != nil {
		log.Fatal(err)
	}
	lease.RequirePrimary(cfg) // epochs come from the primary, never a replica
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE reports (day text PRIMARY KEY, sent_at timestamptz);
		INSERT INTO reports (day) VALUES ('2026-12-01'), ('2026-12-02')`); err != nil {
		log.Fatal(err)
	}
	report := func(day string) {
		var intents int
		var epoch int64
		var sent bool
		if err := pool.QueryRow(ctx, testdb.SQL(`SELECT count(i.*), coalesce(max(i.epoch), 0), bool_or(r.sent_at IS NOT NULL)
			FROM reports r LEFT JOIN fencegate.intents i ON i.resource_id = 'nightly-report' AND i.operation_id = 'report-' || r.day
			WHERE r.day = $1`), day).Scan(&intents, &epoch, &sent); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: sent %v, %d intent(s), at epoch %d\n", day, sent, intents, epoch)
	}

	if err := sendNightlyReport(ctx, pool, "2026-12-01"); err != nil {
		log.Fatal(err)
	}
	report("2026-12-01")
	// The same day again: worker-a holds the lease, acquires again (a new
	// epoch), and the operation id answers with the committed intent.
	if err := sendNightlyReport(ctx, pool, "2026-12-01"); err != nil {
		log.Fatal(err)
	}
	report("2026-12-01")

	// worker-a gives the lease up and worker-b takes it: worker-a's next
	// run is refused before it writes anything.
	issuer := lease.NewIssuer(pool, lease.WithSchema(schema))
	r, err := issuer.Get(ctx, "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	if err := issuer.Release(ctx, "nightly-report", "worker-a", r.Epoch); err != nil {
		log.Fatal(err)
	}
	if _, err := issuer.Acquire(ctx, "nightly-report", "worker-b", time.Minute); err != nil {
		log.Fatal(err)
	}
	err = sendNightlyReport(ctx, pool, "2026-12-02")
	var held *lease.HeldError
	if errors.As(err, &held) {
		fmt.Printf("refused: held by %s at epoch %d\n", held.Holder, held.Epoch)
	}
	report("2026-12-02")
	// Output:
	// 2026-12-01: sent true, 1 intent(s), at epoch 1
	// 2026-12-01: sent true, 1 intent(s), at epoch 1
	// refused: held by worker-b at epoch 3
	// 2026-12-02: sent false, 0 intent(s), at epoch 0
}
