package lease_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// A long-running worker: it holds the lease on "invoices" with a Keeper
// and, while the Keeper's context lives, sends the unsent invoices in
// batches, each batch one transaction of its own that marks the rows and
// enqueues their emails (outbox.EnqueueTx) at the lease's epoch. A lost
// lease ends the context; the worker then takes the lease again, with a
// new epoch, and whatever the old epoch still tries to commit is refused.
//
// It needs a migrated database in GATEWAY_DATABASE_URL with an invoices
// table of its own, so it has no Output line: go test compiles it and does
// not run it; TestExampleHoldBatch runs its batch against a test database.
func ExampleIssuer_Hold() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
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
	issuer := lease.NewIssuer(pool, lease.WithSchema(os.Getenv("GATEWAY_SCHEMA")))
	ob, err := outbox.New(pool, outbox.Config{Schema: os.Getenv("GATEWAY_SCHEMA")})
	if err != nil {
		log.Fatal(err)
	}

	for ctx.Err() == nil {
		k, err := issuer.Hold(ctx, "invoices", "worker-a", lease.KeeperConfig{TTL: 15 * time.Second})
		var held *lease.HeldError
		switch {
		case errors.As(err, &held):
			// Another worker holds it: try again once its lease may have
			// expired.
			select {
			case <-ctx.Done():
			case <-time.After(max(time.Until(held.ExpiresAt), time.Second)):
			}
			continue
		case err != nil:
			log.Fatal(err)
		}
		err = sendInvoices(k, pool, ob) // until k.Context() ends
		k.Stop()
		switch {
		case ctx.Err() != nil: // interrupted: done
		case errors.Is(k.Err(), lease.ErrLeaseLost), errors.Is(err, lease.ErrStaleEpoch):
			log.Printf("lease on invoices lost (%v); taking it again", cmp.Or(k.Err(), err))
		case err != nil:
			log.Fatal(err)
		}
	}
}

// sendInvoices works under the Keeper's context: every statement is
// cancelled as soon as the lease can no longer be trusted.
func sendInvoices(k *lease.Keeper, pool *pgxpool.Pool, ob *outbox.Client) error {
	ctx := k.Context()
	for ctx.Err() == nil {
		n, err := sendBatch(ctx, k.Epoch(), pool, ob)
		if err != nil {
			return err
		}
		if n == 0 { // nothing to send: look again in a while
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// sendBatch marks up to 100 invoices sent and enqueues their emails in one
// transaction: both commit, or neither does. EnqueueTx refuses a stale
// epoch (*outbox.StaleEpochError) and then nothing of tx is committed.
func sendBatch(ctx context.Context, epoch int64, pool *pgxpool.Pool, ob *outbox.Client) (int, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // a no-op after Commit
	rows, err := tx.Query(ctx, `UPDATE invoices SET sent_at = now()
		WHERE id IN (SELECT id FROM invoices WHERE sent_at IS NULL ORDER BY id LIMIT 100 FOR UPDATE)
		RETURNING id, email`)
	if err != nil {
		return 0, err
	}
	type invoice struct {
		ID    int64
		Email string
	}
	var batch []invoice
	for rows.Next() {
		var in invoice
		if err := rows.Scan(&in.ID, &in.Email); err != nil {
			return 0, err
		}
		batch = append(batch, in)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for _, in := range batch {
		payload, _ := json.Marshal(map[string]string{"to": in.Email, "from": "billing@example.com",
			"subject": fmt.Sprintf("Invoice %d", in.ID), "text": "…"})
		// The operation id makes a retry of the same invoice a duplicate,
		// whichever epoch retries it.
		if _, err := ob.EnqueueTx(ctx, tx, outbox.Intent{Resource: "invoices", Epoch: epoch,
			OperationID: fmt.Sprintf("invoice-%d", in.ID), Kind: "email", Payload: payload}); err != nil {
			return 0, err
		}
	}
	return len(batch), tx.Commit(ctx)
}

// The Keeper's timing for a 30 s lease: it renews every TTL/3 and stops
// trusting the lease TTL/10 before it expires; its pause detector ticks
// every 10 ms.
func ExampleKeeperConfig_WithDefaults() {
	c := lease.KeeperConfig{TTL: 30 * time.Second}.WithDefaults()
	fmt.Println("renew every", c.RenewEvery, "margin", c.Margin, "pause tick", c.PauseTick)
	// Output: renew every 10s margin 3s pause tick 10ms
}

// TestExampleHoldBatch runs ExampleIssuer_Hold's batch: the rows and their
// intents commit together at the Keeper's epoch; after a takeover the old
// epoch's batch is refused and leaves the rows unsent.
func TestExampleHoldBatch(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (id bigint PRIMARY KEY, email text NOT NULL, sent_at timestamptz);
		INSERT INTO invoices (id, email) VALUES (1, 'a@example.com'), (2, 'b@example.com')`); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	k, err := iss.Hold(ctx, "invoices", "worker-a", lease.KeeperConfig{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	if n, err := sendBatch(k.Context(), k.Epoch(), pool, ob); n != 2 || err != nil {
		t.Fatalf("sendBatch = %d, %v; want 2 sent", n, err)
	}
	var intents, sent int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT (SELECT count(*) FROM fencegate.intents WHERE resource_id = 'invoices' AND epoch = $1),
		(SELECT count(*) FROM invoices WHERE sent_at IS NOT NULL)`), k.Epoch()).Scan(&intents, &sent); err != nil {
		t.Fatal(err)
	}
	if intents != 2 || sent != 2 {
		t.Fatalf("%d intents at epoch %d and %d invoices sent; want 2 and 2", intents, k.Epoch(), sent)
	}

	// Taken over: the old epoch's next batch is refused, nothing of it kept.
	if _, err := pool.Exec(ctx, `INSERT INTO invoices (id, email) VALUES (3, 'c@example.com')`); err != nil {
		t.Fatal(err)
	}
	if _, err := iss.Advance(ctx, "invoices", k.Epoch()+1); err != nil {
		t.Fatal(err)
	}
	_, err = sendBatch(ctx, k.Epoch(), pool, ob)
	var stale *outbox.StaleEpochError
	if !errors.As(err, &stale) || !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("batch at the old epoch = %v; want a *outbox.StaleEpochError", err)
	}
	var unsent bool
	if err := pool.QueryRow(ctx, `SELECT sent_at IS NULL FROM invoices WHERE id = 3`).Scan(&unsent); err != nil {
		t.Fatal(err)
	}
	if !unsent {
		t.Fatal("a refused batch marked its invoice sent")
	}
}
