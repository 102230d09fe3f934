package durable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/durable"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// asyncCommitCluster starts a PostgreSQL cluster (fsync on) that
// acknowledges commits before their WAL is flushed (pgcluster.AsyncCommit).
func asyncCommitCluster(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	c, err := pgcluster.Start(context.Background(), pgcluster.Options{Durable: true, Settings: pgcluster.AsyncCommit()})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

// plainPool is a pool as a user's program makes it: nothing of the
// gateway's own configuration (so the library alone must be durable).
func plainPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestAcknowledgedDecisionsSurviveACrash: on a server with
// synchronous_commit=off, every decision the library acknowledged — a
// grant, a renewal, an enqueue (alone, in the caller's transaction, in a
// batch), an attempt's ownership of an idempotency key and its recorded
// outcome — is still there after an immediate stop (no flush of WAL in
// memory) and a restart. Without the durable transactions the grant is lost
// and the next acquire hands out the same epoch again.
func TestAcknowledgedDecisionsSurviveACrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := asyncCommitCluster(t)
	{
		setup := plainPool(t, c.URL("postgres"))
		if _, err := testdb.Migrate(ctx, setup); err != nil {
			t.Fatal(err)
		}
		// Make sure the migrations are on disk before the acknowledged
		// work starts (their commits were asynchronous too).
		if _, err := setup.Exec(ctx, `CHECKPOINT`); err != nil {
			t.Fatal(err)
		}
		setup.Close()
	}
	pool := plainPool(t, c.URL("postgres"))
	var sc string
	if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc); err != nil || sc != "off" {
		t.Fatalf("synchronous_commit = %q (%v), want off at the server", sc, err)
	}
	iss := coretest.Issuer(pool)
	ob := coretest.Outbox(t, pool)
	store := coretest.Store(t, pool)

	// One asynchronous commit first: the WAL writer flushes the first one
	// after a quiet spell at once, which would hide a lost grant.
	if _, err := pool.Exec(ctx, `CREATE TABLE warmup (id int)`); err != nil {
		t.Fatal(err)
	}
	l, err := iss.Acquire(ctx, "reports/durable", "worker-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iss.Renew(ctx, "reports/durable", "worker-a", l.Epoch, time.Minute); err != nil {
		t.Fatal(err)
	}
	payload := json.RawMessage(`{"to":"alice@example.com","from":"reports@example.com","subject":"s","text":"t"}`)
	alone, err := ob.Enqueue(ctx, outbox.Intent{Resource: "reports/durable", Epoch: l.Epoch, OperationID: "alone", Kind: "email", Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	// In the caller's transaction: the caller's commit is made durable too.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE invoices (id int)`); err != nil {
		t.Fatal(err)
	}
	inTx, err := ob.EnqueueTx(ctx, tx, outbox.Intent{Resource: "reports/durable", Epoch: l.Epoch, OperationID: "in-tx", Kind: "email", Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	batch, err := ob.EnqueueBatch(ctx, []outbox.Intent{{Resource: "reports/durable", Epoch: l.Epoch, OperationID: "batch", Kind: "email", Payload: payload}})
	if err != nil || batch[0].Err != nil {
		t.Fatalf("batch: %v %v", err, batch)
	}
	d, err := store.Begin(ctx, "email", "key-1", "fp", alone.IntentID)
	if err != nil || d.Outcome != idempotency.OutcomeExecute {
		t.Fatalf("begin: %v %+v", err, d)
	}
	if _, err := store.Complete(ctx, idempotency.Completion{Kind: "email", Key: "key-1", Token: d.Token, IntentID: alone.IntentID, Status: outbox.StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	d2, err := store.Begin(ctx, "email", "key-2", "fp", inTx.IntentID)
	if err != nil || d2.Outcome != idempotency.OutcomeExecute {
		t.Fatalf("begin: %v %+v", err, d2)
	}

	// A grant of another resource, last: no later commit can carry it
	// to disk by accident.
	last, err := iss.Acquire(ctx, "reports/durable-last", "worker-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	// Crash: nothing in memory reaches the disk.
	pool.Close()
	if err := c.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgain(ctx); err != nil {
		t.Fatal(err)
	}
	after := plainPool(t, c.URL("postgres"))

	var epoch int64
	var holder *string
	if err := after.QueryRow(ctx, testdb.SQL(`SELECT epoch, holder FROM fencegate.resources WHERE resource_id = 'reports/durable'`)).Scan(&epoch, &holder); err != nil {
		t.Fatalf("the acknowledged grant is gone after the crash: %v", err)
	}
	if epoch != l.Epoch || holder == nil || *holder != "worker-a" {
		t.Fatalf("after the crash: epoch %d holder %v, want the acknowledged epoch %d held by worker-a", epoch, holder, l.Epoch)
	}
	var lastEpoch int64
	if err := after.QueryRow(ctx, testdb.SQL(`SELECT epoch FROM fencegate.resources WHERE resource_id = 'reports/durable-last'`)).Scan(&lastEpoch); err != nil || lastEpoch != last.Epoch {
		t.Errorf("the last acknowledged grant (epoch %d) is gone after the crash: epoch %d (%v)", last.Epoch, lastEpoch, err)
	}
	for _, op := range []string{"alone", "in-tx", "batch"} {
		var n int
		if err := after.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.intents WHERE operation_id = $1`), op).Scan(&n); err != nil || n != 1 {
			t.Errorf("acknowledged intent %q: %d rows after the crash (%v), want 1", op, n, err)
		}
	}
	if err := after.QueryRow(ctx, `SELECT count(*) FROM invoices`).Scan(new(int)); err != nil {
		t.Errorf("the caller's own write committed with EnqueueTx is gone: %v", err)
	}
	for key, want := range map[string]string{"key-1": "completed", "key-2": "started"} {
		var state string
		if err := after.QueryRow(ctx, testdb.SQL(`SELECT state FROM fencegate.idempotency_keys WHERE idempotency_key = $1`), key).Scan(&state); err != nil || state != want {
			t.Errorf("idempotency key %s: state %q (%v) after the crash, want %q", key, state, err, want)
		}
	}
	// And the next grant is above the acknowledged one: no token twice.
	iss2 := coretest.Issuer(after)
	if _, err := after.Exec(ctx, testdb.SQL(`UPDATE fencegate.resources SET lease_expires_at = now() WHERE resource_id = 'reports/durable'`)); err != nil {
		t.Fatal(err)
	}
	l2, err := iss2.Acquire(ctx, "reports/durable", "worker-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Epoch <= l.Epoch {
		t.Fatalf("epoch %d granted again after a crash (first grant %d)", l2.Epoch, l.Epoch)
	}
}

// TestDurableKeepsStrongerSettings: a session already at remote_apply (or
// remote_write) is not lowered to on.
func TestDurableKeepsStrongerSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := asyncCommitCluster(t)
	pool := plainPool(t, c.URL("postgres"))
	for _, tc := range []struct{ session, want string }{
		{"off", "on"}, {"local", "on"}, {"on", "on"}, {"remote_write", "remote_write"}, {"remote_apply", "remote_apply"},
	} {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf(`SET synchronous_commit = %s`, tc.session)); err != nil {
			t.Fatal(err)
		}
		tx, err := durable.Begin(ctx, conn, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var got string
		if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		var where string
		if err := conn.QueryRow(ctx, `SELECT current_setting('synchronous_commit') FROM (SELECT 1) s WHERE `+durable.Where).Scan(&where); err != nil {
			t.Fatal(err)
		}
		conn.Release()
		if got != tc.want || where != tc.want {
			t.Errorf("session %s: in a durable transaction %q, after Where %q; want %q", tc.session, got, where, tc.want)
		}
	}
}
