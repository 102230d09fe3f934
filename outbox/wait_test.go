package outbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Wait answers when the intent reaches a final status, woken by the
// outcome notification (well before the 10 s re-read), for many waiters
// at once on one listening connection; it returns the current record and
// the context's error when the wait ends first; ErrNotFound for no intent.
func TestWaitForAnOutcome(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())).Acquire(ctx, "wait", "w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ob.Enqueue(ctx, outbox.Intent{Resource: "wait", Epoch: l.Epoch, OperationID: "op", Kind: "file",
		Payload: []byte(`{"target":"x.txt","content":"x"}`)})
	if err != nil {
		t.Fatal(err)
	}

	// The wait ends first: the intent as it is, and the deadline.
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	rec, err := ob.Wait(sctx, res.IntentID)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || rec == nil || rec.Status != outbox.StatusPending {
		t.Fatalf("Wait until a deadline: %v, %v; want the pending intent and DeadlineExceeded", rec, err)
	}

	// Eight waiters; the intent is cancelled (an operator) in another
	// transaction: every waiter answers, soon.
	var wg sync.WaitGroup
	got := make(chan *outbox.Record, 8)
	for range 8 {
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			r, err := ob.Wait(wctx, res.IntentID)
			if err != nil {
				t.Errorf("Wait: %v", err)
				return
			}
			got <- r
		})
	}
	// The listener LISTENs before the waiters read (they would see an
	// earlier outcome by that read; this checks the notification).
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN `+testdb.PGSchema().OutcomesChannel()+`'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections LISTENing for outcomes, want 1 for all waiters", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := intents.In(testdb.PGSchema()).Cancel(ctx, tx, res.IntentID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(got)
	n := 0
	for r := range got {
		n++
		if r.Status != outbox.StatusCancelled {
			t.Errorf("Wait returned %s, want cancelled", r.Status)
		}
	}
	if took := time.Since(start); n != 8 || took > 5*time.Second {
		t.Errorf("%d waiters answered after %s; want 8, woken by the notification (not the 10 s re-read)", n, took)
	}
	// A finished intent answers at once; an unknown one is not found.
	if r, err := ob.Wait(ctx, res.IntentID); err != nil || r.Status != outbox.StatusCancelled {
		t.Errorf("Wait on a finished intent: %v %v", r, err)
	}
	if _, err := ob.Wait(ctx, 999999); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("Wait on no intent: %v, want ErrNotFound", err)
	}
}

// A wait that ends with its context returns the intent as it is then, read
// again, not as the waiter last read it (with no notification it re-reads
// only every second, or 10 s while listening): an intent relayed meanwhile
// is answered relayed. The old code answered the first read (pending).
func TestWaitEndsWithTheIntentAsItIsThen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	res, err := b.client.Enqueue(ctx, emailIntent("wait", b.acquire(t, "wait", "w", time.Minute).Epoch, "op"))
	if err != nil {
		t.Fatal(err)
	}
	// The waiter's client has a pool of its own, which nothing else uses
	// (it polls, it sends no NOTIFY): a connection going back to it is the
	// signal that the waiter's first read is done.
	cfg := b.pool.Config().Copy()
	released := make(chan struct{}, 64)
	cfg.AfterRelease = func(*pgx.Conn) bool {
		select {
		case released <- struct{}{}:
		default:
		}
		return true
	}
	wpool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer wpool.Close()
	waiter, err := outbox.New(wpool, outbox.Config{Schema: testdb.Schema(), DisableListen: true, DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		rec *outbox.Record
		err error
	}
	done := make(chan answer, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
		defer cancel()
		rec, err := waiter.Wait(wctx, res.IntentID)
		done <- answer{rec, err}
	}()
	select {
	case <-released: // the waiter's first read
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not read its intent")
	}
	if _, err := b.pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.intents SET status = 'relayed' WHERE intent_id = $1`), res.IntentID); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if !errors.Is(a.err, context.DeadlineExceeded) || a.rec == nil || a.rec.Status != outbox.StatusRelayed {
		t.Fatalf("Wait until its deadline: %+v, %v; want the intent as it is then (relayed) and DeadlineExceeded", a.rec, a.err)
	}
}
