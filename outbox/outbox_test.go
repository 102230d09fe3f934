package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/faultproxy"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// The article's scenario: A takes the lease (epoch n) with a short TTL and
// pauses past it; B takes over (n+1) and enqueues; A wakes and enqueues with
// n: rejected with the typed error, nothing of A's stored; A's renew fails.
func TestArticleScenarioStaleWriterRejected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const ttl = 200 * time.Millisecond

	a := b.acquire(t, "nightly-report", "worker-A", ttl)
	// A "pauses": we wait until PostgreSQL's clock says the lease expired.
	deadline := time.Now().Add(5 * time.Second)
	var bl lease.Lease
	var err error
	for {
		bl, err = b.issuer.Acquire(ctx, "nightly-report", "worker-B", 10*time.Second)
		if err == nil {
			break
		}
		if !errors.Is(err, lease.ErrHeld) || time.Now().After(deadline) {
			t.Fatalf("B acquire: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if bl.Epoch != a.Epoch+1 {
		t.Fatalf("B epoch = %d, want %d", bl.Epoch, a.Epoch+1)
	}
	res, err := b.client.Enqueue(ctx, emailIntent("nightly-report", bl.Epoch, "B-publish"))
	if err != nil || res.Duplicate || res.Status != outbox.StatusPending {
		t.Fatalf("B enqueue = %+v, %v", res, err)
	}

	// A wakes up and writes with its old epoch.
	_, err = b.client.Enqueue(ctx, emailIntent("nightly-report", a.Epoch, "A-publish"))
	var stale *outbox.StaleEpochError
	if !errors.As(err, &stale) || !errors.Is(err, outbox.ErrStaleEpoch) {
		t.Fatalf("A enqueue = %v; want *StaleEpochError", err)
	}
	if stale.Resource != "nightly-report" || stale.Supplied != a.Epoch || stale.Current != bl.Epoch {
		t.Fatalf("stale error = %+v", stale)
	}
	if n := countIntents(t, b.pool, "operation_id = 'A-publish'"); n != 0 {
		t.Fatalf("A's intent stored %d times; want 0", n)
	}
	if n := countIntents(t, b.pool, ""); n != 1 {
		t.Fatalf("intents = %d; want only B's", n)
	}
	if _, err := b.issuer.Renew(ctx, "nightly-report", "worker-A", a.Epoch, ttl); !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("A renew = %v; want ErrStaleEpoch", err)
	}
}

func TestEnqueueUnknownResourceAndFutureEpoch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.client.Enqueue(ctx, emailIntent("never-leased", 1, "op"))
	var stale *outbox.StaleEpochError
	if !errors.As(err, &stale) || stale.Current != 0 {
		t.Fatalf("enqueue on a resource with no epoch = %v; want stale, current 0", err)
	}
	l := b.acquire(t, "r", "A", time.Minute)
	if _, err := b.client.Enqueue(ctx, emailIntent("r", l.Epoch+1, "op")); !errors.Is(err, outbox.ErrStaleEpoch) {
		t.Fatalf("enqueue with a never-issued epoch = %v; want stale", err)
	}
	if n := countIntents(t, b.pool, ""); n != 0 {
		t.Fatalf("intents = %d; want 0", n)
	}
}

// Lost response: the enqueue commits but the caller never sees the answer.
// The retry with the same operation id returns the same intent, marked
// duplicate; one row. The same operation id with another payload conflicts.
func TestLostResponseRetryIsDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "r", "A", time.Minute)

	// A client whose connection goes through a proxy that loses the answer.
	cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	host, port, _ := strings.Cut(proxy.Addr(), ":")
	cfg.ConnConfig.Host = host
	fmt.Sscan(port, &cfg.ConnConfig.Port)
	// The simple protocol sends the statement text with its execution, so
	// the proxy drops exactly the answer to the executing statement.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	lossy, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lossy.Close()
	lc, _ := outbox.New(lossy, outbox.Config{Schema: testdb.Schema()})

	dropped := proxy.DropResponseTo("fencegate_enqueue")
	_, err = lc.Enqueue(ctx, emailIntent("r", l.Epoch, "send-1"))
	if err == nil {
		t.Fatal("enqueue through the lossy proxy succeeded; the answer should have been lost")
	}
	<-dropped
	if n := countIntents(t, b.pool, "operation_id = 'send-1'"); n != 1 {
		t.Fatalf("after the lost answer: %d rows; want the commit to have happened (1)", n)
	}

	// The worker retries (on a healthy connection).
	res, err := b.client.Enqueue(ctx, emailIntent("r", l.Epoch, "send-1"))
	if err != nil || !res.Duplicate {
		t.Fatalf("retry = %+v, %v; want duplicate", res, err)
	}
	orig, err := b.client.Lookup(ctx, "r", "send-1")
	if err != nil || orig.IntentID != res.IntentID {
		t.Fatalf("lookup = %+v, %v; want intent %d", orig, err, res.IntentID)
	}
	if n := countIntents(t, b.pool, ""); n != 1 {
		t.Fatalf("rows = %d; want 1", n)
	}

	// Same operation id, different content: conflict, nothing stored.
	other := emailIntent("r", l.Epoch, "send-1")
	other.Payload = json.RawMessage(strings.Replace(emailPayload, "all good", "changed", 1))
	_, err = b.client.Enqueue(ctx, other)
	var conf *outbox.ConflictError
	if !errors.As(err, &conf) || !errors.Is(err, outbox.ErrOperationConflict) || conf.IntentID != res.IntentID {
		t.Fatalf("different content = %v; want ConflictError naming %d", err, res.IntentID)
	}
	for _, mutate := range []func(*outbox.Intent){
		func(in *outbox.Intent) { in.IdempotencyKey = "other-key" },
		func(in *outbox.Intent) { in.Fence = outbox.FenceExecute },
	} {
		in := emailIntent("r", l.Epoch, "send-1")
		mutate(&in)
		if _, err := b.client.Enqueue(ctx, in); !errors.Is(err, outbox.ErrOperationConflict) {
			t.Fatalf("changed key/fence = %v; want conflict", err)
		}
	}
	if n := countIntents(t, b.pool, ""); n != 1 {
		t.Fatalf("rows after conflicts = %d; want 1", n)
	}

	// A retry after a takeover still gets the committed intent: nothing new
	// is written, so nothing stale slips in.
	expire(t, b.pool, "r")
	if _, err := b.issuer.Acquire(ctx, "r", "B", time.Minute); err != nil {
		t.Fatal(err)
	}
	res2, err := b.client.Enqueue(ctx, emailIntent("r", l.Epoch, "send-1"))
	if err != nil || !res2.Duplicate || res2.IntentID != res.IntentID {
		t.Fatalf("retry after takeover = %+v, %v; want the duplicate", res2, err)
	}
	// But a new operation with the old epoch is fenced.
	if _, err := b.client.Enqueue(ctx, emailIntent("r", l.Epoch, "send-2")); !errors.Is(err, outbox.ErrStaleEpoch) {
		t.Fatalf("new op with old epoch = %v; want stale", err)
	}
}

// Key order and whitespace in the payload do not make a retry a conflict.
func TestDuplicateIgnoresJSONFormatting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "r", "A", time.Minute)
	if _, err := b.client.Enqueue(ctx, emailIntent("r", l.Epoch, "op")); err != nil {
		t.Fatal(err)
	}
	in := emailIntent("r", l.Epoch, "op")
	in.Payload = json.RawMessage(`{ "text":"all good", "subject":"Nightly report", "from":"reports@example.com", "to":["alice@example.com"] }`)
	res, err := b.client.Enqueue(ctx, in)
	if err != nil || !res.Duplicate {
		t.Fatalf("reformatted retry = %+v, %v; want duplicate", res, err)
	}
}

func TestEnqueueTxRollbackLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "r", "A", time.Minute)
	if _, err := b.pool.Exec(ctx, `CREATE TABLE reports (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO reports VALUES ('2026-12-01')`); err != nil {
		t.Fatal(err)
	}
	res, err := b.client.EnqueueTx(ctx, tx, emailIntent("r", l.Epoch, "rolled-back"))
	if err != nil || res.IntentID == 0 {
		t.Fatalf("EnqueueTx = %+v, %v", res, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countIntents(t, b.pool, ""); n != 0 {
		t.Fatalf("intents after rollback = %d; want 0", n)
	}
	if _, err := b.client.Get(ctx, res.IntentID); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Get after rollback = %v; want ErrNotFound", err)
	}

	// Committed together: both there.
	tx, _ = b.pool.Begin(ctx)
	_, _ = tx.Exec(ctx, `INSERT INTO reports VALUES ('2026-12-02')`)
	res, err = b.client.EnqueueTx(ctx, tx, emailIntent("r", l.Epoch, "committed"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := b.client.Get(ctx, res.IntentID)
	if err != nil || rec.OperationID != "committed" || rec.Status != outbox.StatusPending {
		t.Fatalf("Get = %+v, %v", rec, err)
	}

	// A stale EnqueueTx stores nothing, and the caller's tx is still usable.
	tx, _ = b.pool.Begin(ctx)
	defer tx.Rollback(ctx)
	if _, err := b.client.EnqueueTx(ctx, tx, emailIntent("r", l.Epoch+5, "stale")); !errors.Is(err, outbox.ErrStaleEpoch) {
		t.Fatalf("stale EnqueueTx = %v", err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("caller's tx after a stale EnqueueTx: %v", err)
	}
}

func TestGetLookupRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "r", "A", time.Minute)
	in := outbox.Intent{Resource: "r", Epoch: l.Epoch, OperationID: "f1", Kind: "file",
		Payload: json.RawMessage(`{"target":"reports/2026-12-01.txt","content":"hi"}`)}
	res, err := b.client.Enqueue(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.client.Get(ctx, res.IntentID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Fence != outbox.FenceExecute || rec.IdempotencyKey != "r/f1" || rec.Kind != "file" || rec.Epoch != l.Epoch ||
		rec.Status != outbox.StatusPending || rec.Attempts != 0 || rec.Result != nil || rec.CreatedAt.IsZero() {
		t.Fatalf("record = %+v", rec)
	}
	if _, err := b.client.Lookup(ctx, "r", "nope"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Lookup unknown = %v", err)
	}
	if _, err := b.client.Get(ctx, 999999); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Get unknown = %v", err)
	}
	// Defaults: email gets fence commit; explicit key kept.
	e := emailIntent("r", l.Epoch, "e1")
	e.IdempotencyKey = "report/2026-12-01/alice"
	res, _ = b.client.Enqueue(ctx, e)
	rec, _ = b.client.Get(ctx, res.IntentID)
	if rec.Fence != outbox.FenceCommit || rec.IdempotencyKey != "report/2026-12-01/alice" {
		t.Fatalf("email record = %+v", rec)
	}
}
