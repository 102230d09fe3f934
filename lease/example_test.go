package lease_test

import (
	"cmp"
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

// A worker sends the unsent invoices under the lease on "invoices", held
// by a Keeper: each batch is one transaction of its own that marks the rows
// and enqueues their emails (outbox.EnqueueTx) at the lease's epoch. A lost
// lease ends the Keeper's context; the worker then takes the lease again,
// with a new epoch, and whatever the old epoch still tries to commit is
// refused, as the last batch below is once another holder has taken over.
func ExampleIssuer_Hold() {
	ctx := context.Background()
	// A migrated database of the example's own; a program opens
	// GATEWAY_DATABASE_URL (migrated by gateway migrate), the schema it was
	// migrated into in GATEWAY_SCHEMA.
	cfg, err := pgxpool.ParseConfig(testdb.NewURL(testdb.ExampleTB()))
	if err != nil {
		log.Fatal(err)
	}
	schema := testdb.Schema()
	lease.RequirePrimary(cfg) // epochs come from the primary, never a replica
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (id bigint PRIMARY KEY, email text NOT NULL, sent_at timestamptz);
		INSERT INTO invoices (id, email) VALUES (1, 'a@example.com'), (2, 'b@example.com')`); err != nil {
		log.Fatal(err)
	}
	issuer := lease.NewIssuer(pool, lease.WithSchema(schema))
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}

	epoch, err := sendAllInvoices(ctx, issuer, pool, ob)
	if err != nil {
		log.Fatal(err)
	}
	var intents, sent int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT (SELECT count(*) FROM fencegate.intents WHERE resource_id = 'invoices' AND epoch = $1),
		(SELECT count(*) FROM invoices WHERE sent_at IS NOT NULL)`), epoch).Scan(&intents, &sent); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d invoices sent, %d emails enqueued at epoch %d\n", sent, intents, epoch)

	// Another holder takes over (here an outside lock service advances the
	// epoch): a batch the old epoch still commits is refused, and leaves
	// its invoice unsent.
	if _, err := pool.Exec(ctx, `INSERT INTO invoices (id, email) VALUES (3, 'c@example.com')`); err != nil {
		log.Fatal(err)
	}
	if _, err := issuer.Advance(ctx, "invoices", epoch+1); err != nil {
		log.Fatal(err)
	}
	_, err = sendBatch(ctx, epoch, pool, ob)
	var stale *outbox.StaleEpochError
	if errors.As(err, &stale) && errors.Is(err, lease.ErrStaleEpoch) {
		fmt.Printf("batch at epoch %d refused: the current epoch is %d\n", stale.Supplied, stale.Current)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM invoices WHERE sent_at IS NOT NULL`).Scan(&sent); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d invoices sent\n", sent)
	// Output:
	// 2 invoices sent, 2 emails enqueued at epoch 1
	// batch at epoch 1 refused: the current epoch is 2
	// 2 invoices sent
}

// sendAllInvoices sends the unsent invoices under the lease on "invoices"
// and returns the epoch it sent the last batch at. Another holder's live
// lease: it waits until that may have expired. A lost lease: it takes the
// lease again, with a new epoch, and carries on.
func sendAllInvoices(ctx context.Context, issuer *lease.Issuer, pool *pgxpool.Pool, ob *outbox.Client) (int64, error) {
	for {
		k, err := issuer.Hold(ctx, "invoices", "worker-a", lease.KeeperConfig{TTL: 15 * time.Second})
		var held *lease.HeldError
		switch {
		case errors.As(err, &held):
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(max(time.Until(held.ExpiresAt), time.Second)):
			}
			continue
		case err != nil:
			return 0, err
		}
		err = sendInvoices(k, pool, ob) // until none is left or k.Context() ends
		k.Stop()
		switch {
		case ctx.Err() != nil:
			return 0, ctx.Err()
		case errors.Is(k.Err(), lease.ErrLeaseLost), errors.Is(err, lease.ErrStaleEpoch):
			log.Printf("lease on invoices lost (%v); taking it again", cmp.Or(k.Err(), err))
		default:
			return k.Epoch(), err
		}
	}
}

// sendInvoices works under the Keeper's context, so every statement is
// cancelled as soon as the lease can no longer be trusted, until no
// invoice is left to send.
func sendInvoices(k *lease.Keeper, pool *pgxpool.Pool, ob *outbox.Client) error {
	ctx := k.Context()
	for {
		n, err := sendBatch(ctx, k.Epoch(), pool, ob)
		if err != nil || n == 0 {
			return err
		}
	}
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
