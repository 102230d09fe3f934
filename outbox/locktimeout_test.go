package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// TestEnqueueGivesUpOnALockedControlRow: Enqueue, EnqueueBatch and group
// commits (the client's own transactions) wait at most Config.LockTimeout
// for a resource's control row that an open transaction holds, then fail
// with a *BusyError (fenceerr.ErrBusy), nothing stored; before, they
// waited without a bound (a paused worker inside EnqueueTx hung `gateway
// enqueue` and the HTTP intake behind it). EnqueueTx, in the caller's
// transaction, keeps the caller's lock_timeout and is not changed by the
// client's. The wait is bounded by the test's context deadline, so the old
// code fails here with a context error, not a hang.
func TestEnqueueGivesUpOnALockedControlRow(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	l := b.acquire(t, "locked", "w1", time.Minute)
	other := b.acquire(t, "free", "w2", time.Minute)
	release := testdb.LockControlRow(t, b.pool, "locked")

	const bound = 200 * time.Millisecond
	newClient := func(cfg outbox.Config) *outbox.Client {
		t.Helper()
		cfg.Schema = testdb.Schema()
		c, err := outbox.New(b.pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	checkBusy := func(what string, err error, resource string, waited time.Duration) {
		t.Helper()
		var busy *outbox.BusyError
		if !errors.As(err, &busy) || !errors.Is(err, fenceerr.ErrBusy) || !errors.Is(err, lease.ErrBusy) {
			t.Fatalf("%s: want a *outbox.BusyError matching fenceerr.ErrBusy and lease.ErrBusy, got %T %v", what, err, err)
		}
		if busy.Resource != resource || busy.Waited != waited {
			t.Fatalf("%s: BusyError{Resource: %q, Waited: %s}, want {%q, %s}", what, busy.Resource, busy.Waited, resource, waited)
		}
	}
	deadline := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 20*time.Second) }
	checked := 0

	c := newClient(outbox.Config{LockTimeout: bound})
	cctx, cancel := deadline()
	_, err := c.Enqueue(cctx, emailIntent("locked", l.Epoch, "single"))
	cancel()
	checkBusy("Enqueue", err, "locked", bound)
	checked++

	// As a principal (the traced/principal form of the statement).
	cctx, cancel = deadline()
	_, err = c.Enqueue(outbox.WithPrincipal(cctx, "ops"), emailIntent("locked", l.Epoch, "as-principal"))
	cancel()
	checkBusy("Enqueue WithPrincipal", err, "locked", bound)
	checked++

	// A batch: the lock of one resource fails the whole batch; nothing of
	// it is stored, and which resource was locked is not known.
	cctx, cancel = deadline()
	_, err = c.EnqueueBatch(cctx, []outbox.Intent{emailIntent("free", other.Epoch, "batch-free"), emailIntent("locked", l.Epoch, "batch-locked")})
	cancel()
	checkBusy("EnqueueBatch", err, "", bound)
	checked++

	// Group commit: the shared transaction gives up, then each call runs
	// alone, so only the call for the locked resource fails.
	g := newClient(outbox.Config{LockTimeout: bound, GroupCommit: true})
	cctx, cancel = deadline()
	errs := make(chan error, 2)
	for _, in := range []outbox.Intent{emailIntent("locked", l.Epoch, "group-locked"), emailIntent("free", other.Epoch, "group-free")} {
		go func() {
			_, err := g.Enqueue(cctx, in)
			if in.Resource == "free" && err != nil {
				err = errors.New("the free resource's call failed: " + err.Error())
			} else if in.Resource == "free" {
				err = nil
			} else if err == nil {
				err = errors.New("the locked resource's call succeeded")
			} else {
				var busy *outbox.BusyError
				if !errors.As(err, &busy) {
					err = errors.New("the locked resource's call: not a BusyError: " + err.Error())
				} else {
					err = nil
				}
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal("group commit: ", err)
		}
	}
	cancel()
	checked++

	if n := countIntents(t, b.pool, "resource_id = 'locked'"); n != 0 {
		t.Fatalf("%d intents stored for the locked resource, want 0", n)
	}
	if n := countIntents(t, b.pool, "resource_id = 'free' AND operation_id = 'batch-free'"); n != 0 {
		t.Fatalf("the refused batch stored its other intent")
	}

	// The client's bound is for its own statement only: the session's
	// lock_timeout is unchanged afterwards.
	var after string
	if err := b.pool.QueryRow(ctx, "SHOW lock_timeout").Scan(&after); err != nil || after != "0" {
		t.Fatalf("lock_timeout after the enqueues: %q, %v; want 0", after, err)
	}

	// EnqueueTx runs in the caller's transaction, with the caller's
	// lock_timeout (set here), which the client neither sets nor leaves
	// changed; running into it is a BusyError too (Waited 0: the server's
	// bound).
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = 150"); err != nil {
		t.Fatal(err)
	}
	cctx, cancel = deadline()
	_, err = c.EnqueueTx(cctx, tx, emailIntent("locked", l.Epoch, "in-tx"))
	cancel()
	checkBusy("EnqueueTx", err, "locked", 0)
	checked++

	// Released, the same client enqueues.
	release()
	if _, err := c.Enqueue(ctx, emailIntent("locked", l.Epoch, "after")); err != nil {
		t.Fatalf("after the lock is released: %v", err)
	}
	t.Logf("checked %d waits on a locked control row", checked)
	if checked != 5 {
		t.Fatalf("checked %d cases, want 5", checked)
	}
}

// TestLockTimeoutConfig: the default bound, and no bound when negative.
func TestLockTimeoutConfig(t *testing.T) {
	if got := (outbox.Config{}).WithDefaults().LockTimeout; got != outbox.DefaultLockTimeout || outbox.DefaultLockTimeout != 5*time.Second {
		t.Fatalf("default LockTimeout %s, want DefaultLockTimeout (5s)", got)
	}
	if got := (outbox.Config{LockTimeout: -1}).WithDefaults().LockTimeout; got != -1 {
		t.Fatalf("negative LockTimeout became %s", got)
	}
}
