package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

const testEmail = `{"to":["alice@example.com"],"from":"reports@example.com","subject":"s","text":"t"}`

func emailIntent(resource string, epoch int64, op string) outbox.Intent {
	return outbox.Intent{Resource: resource, Epoch: epoch, OperationID: op, Kind: "email", Payload: json.RawMessage(testEmail)}
}

// Every successful acquire is a new fencing token, also for the holder that
// already holds a live lease: a retried acquire (a lost response) gets
// another epoch and the orphaned one is fenced out at once.
func TestEveryAcquireIsANewEpoch(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ob := newOutbox(t, pool)
	ctx := context.Background()
	first, err := iss.Acquire(ctx, "r", "A", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	second, err := iss.Acquire(ctx, "r", "A", time.Hour) // e.g. the retry after a lost response
	if err != nil || second.Epoch <= first.Epoch {
		t.Fatalf("second acquire by the live holder = %+v, %v; want an epoch above %d", second, err, first.Epoch)
	}
	if _, err := ob.Enqueue(ctx, emailIntent("r", first.Epoch, "orphan")); !errors.Is(err, outbox.ErrStaleEpoch) {
		t.Fatalf("enqueue with the orphaned epoch %d = %v; want ErrStaleEpoch", first.Epoch, err)
	}
	if _, err := iss.Renew(ctx, "r", "A", first.Epoch, time.Hour); !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("renew with the orphaned epoch = %v; want ErrStaleEpoch", err)
	}
	// Renew extends and keeps the epoch.
	r, err := iss.Renew(ctx, "r", "A", second.Epoch, 2*time.Hour)
	if err != nil || r.Epoch != second.Epoch {
		t.Fatalf("renew = %+v, %v; want epoch %d kept", r, err, second.Epoch)
	}
	if _, err := ob.Enqueue(ctx, emailIntent("r", second.Epoch, "current")); err != nil {
		t.Fatalf("enqueue with the current epoch: %v", err)
	}
	g, err := iss.History(ctx, "r", 1)
	if err != nil || len(g) != 1 || g[0].Epoch != second.Epoch || g[0].How != lease.HowReacquired ||
		g[0].PreviousHolder != "A" || g[0].PreviousEpoch != first.Epoch {
		t.Fatalf("newest grant = %+v, %v; want %d reacquired from A at %d", g, err, second.Epoch, first.Epoch)
	}
}

// A worker loop whose Keeper lost its lease (here: renewals could not get
// through, so the Keeper stopped trusting the lease while PostgreSQL still
// counts it live) calls Hold again: it must get a NEW epoch, and whatever
// the old iteration still writes with the old epoch is refused as stale.
func TestHoldAgainAfterLostGetsNewEpoch(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ob := newOutbox(t, pool)
	ctx := context.Background()
	// Trusted for 1s by the Keeper, live for 30s by PostgreSQL's clock: the
	// second Hold comes long before the old lease expires there.
	cfg := lease.KeeperConfig{TTL: 30 * time.Second, RenewEvery: 900 * time.Millisecond, Margin: 29 * time.Second, PauseTick: -1}
	k1, err := iss.Hold(ctx, "job", "worker-A", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer k1.Stop()
	old := k1.Epoch()

	// Block renewals: keep the control row locked until the Keeper gives up.
	unlock := testdb.LockControlRow(t, pool, "job")
	if err := keeperEnds(t, k1, 30*time.Second, "renewals blocked"); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("keeper cause = %v; want ErrLeaseLost", err)
	}
	unlock()
	if r, err := iss.Get(ctx, "job"); err != nil || !r.LeaseLive || r.Holder != "worker-A" || r.Epoch != old {
		t.Fatalf("resource after the keeper gave up = %+v, %v; want worker-A's epoch %d still live by PostgreSQL's clock", r, err, old)
	}

	// The loop's next iteration.
	k2, err := iss.Hold(ctx, "job", "worker-A", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Stop()
	if k2.Epoch() <= old {
		t.Fatalf("Hold after the lease was lost returned epoch %d; want a new epoch above %d", k2.Epoch(), old)
	}
	// The previous iteration, still running, writes with the old epoch.
	_, err = ob.Enqueue(ctx, emailIntent("job", old, "late-write"))
	var stale *outbox.StaleEpochError
	if !errors.As(err, &stale) || stale.Supplied != old || stale.Current != k2.Epoch() {
		t.Fatalf("enqueue with the lost epoch %d = %v; want stale (current %d)", old, err, k2.Epoch())
	}
	if _, err := ob.Enqueue(ctx, emailIntent("job", k2.Epoch(), "fresh-write")); err != nil {
		t.Fatalf("enqueue with the new epoch: %v", err)
	}
}

// Epochs stop at lease.MaxEpoch (2^53): above it is bad input naming epoch,
// nothing stored; a resource at the ceiling refuses acquire with a clear
// error instead of overflowing.
func TestEpochCeiling(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ob := newOutbox(t, pool)
	ctx := context.Background()
	if lease.MaxEpoch != 9007199254740992 || outbox.MaxEpoch != lease.MaxEpoch {
		t.Fatalf("MaxEpoch: lease %d, outbox %d; want both 2^53", lease.MaxEpoch, outbox.MaxEpoch)
	}
	isEpochInput := func(what string, err error) {
		t.Helper()
		var inv *lease.InvalidError
		if !errors.As(err, &inv) || inv.Field != "epoch" {
			t.Fatalf("%s = %v; want *lease.InvalidError naming epoch", what, err)
		}
	}
	for _, e := range []int64{lease.MaxEpoch + 1, math.MaxInt64} {
		_, err := iss.Advance(ctx, "r", e)
		isEpochInput("advance above the ceiling", err)
		_, err = iss.Renew(ctx, "r", "A", e, time.Second)
		isEpochInput("renew above the ceiling", err)
		isEpochInput("release above the ceiling", iss.Release(ctx, "r", "A", e))
		var oinv *outbox.ValidationError
		if _, err := ob.Enqueue(ctx, emailIntent("r", e, "op")); !errors.As(err, &oinv) || oinv.Field != "epoch" {
			t.Fatalf("enqueue with epoch %d = %v; want a ValidationError naming epoch", e, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.resources`)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("resources after bad epochs: %d (%v); want 0", n, err)
	}

	// One below the ceiling: the last epoch can still be granted.
	if _, err := iss.Advance(ctx, "r", lease.MaxEpoch-1); err != nil {
		t.Fatal(err)
	}
	l, err := iss.Acquire(ctx, "r", "A", time.Hour)
	if err != nil || l.Epoch != lease.MaxEpoch {
		t.Fatalf("acquire of the last epoch = %+v, %v; want %d", l, err, lease.MaxEpoch)
	}
	if _, err := ob.Enqueue(ctx, emailIntent("r", lease.MaxEpoch, "last")); err != nil {
		t.Fatalf("enqueue with MaxEpoch: %v", err)
	}
	// The holder can renew and release it; then nobody can acquire.
	if _, err := iss.Renew(ctx, "r", "A", lease.MaxEpoch, time.Hour); err != nil {
		t.Fatalf("renew at the ceiling: %v", err)
	}
	for _, holder := range []string{"A", "B"} {
		_, err = iss.Acquire(ctx, "r", holder, time.Hour)
		if holder == "B" {
			if !errors.Is(err, lease.ErrHeld) {
				t.Fatalf("acquire by B while A holds the last epoch = %v; want ErrHeld", err)
			}
			continue
		}
		isEpochInput("acquire at the ceiling by the holder", err)
		if !strings.Contains(err.Error(), "exhausted") {
			t.Fatalf("acquire at the ceiling: %q should say the epochs are exhausted", err)
		}
	}
	if err := iss.Release(ctx, "r", "A", lease.MaxEpoch); err != nil {
		t.Fatal(err)
	}
	_, err = iss.Acquire(ctx, "r", "B", time.Hour)
	isEpochInput("acquire of an exhausted resource", err)
	if !strings.Contains(err.Error(), "exhausted") {
		t.Fatalf("acquire of an exhausted resource: %q should say the epochs are exhausted", err)
	}
	// Advance to the ceiling itself is a no-op; the resource is unchanged.
	if r, err := iss.Advance(ctx, "r", lease.MaxEpoch); err != nil || r.Epoch != lease.MaxEpoch {
		t.Fatalf("advance to the ceiling = %+v, %v", r, err)
	}
	if r, err := iss.Get(ctx, "r"); err != nil || r.Epoch != lease.MaxEpoch || r.Holder != "" {
		t.Fatalf("exhausted resource = %+v, %v; want epoch %d, no holder", r, err, lease.MaxEpoch)
	}
	// The schema refuses it too, whatever writes the row.
	if _, err := pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.resources SET epoch = epoch + 1 WHERE resource_id = 'r'`)); err == nil {
		t.Fatal("the schema let an epoch past 2^53")
	}
}

// A worker paused inside outbox.EnqueueTx keeps the resource's control row
// locked. Grants wait for that lock at most the issuer's lock timeout, then
// fail with ErrBusy naming the resource; once the transaction ends, they
// work again.
func TestGrantsBoundedByLockTimeout(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	const bound = 300 * time.Millisecond
	iss := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()), lease.WithLockTimeout(bound))
	ob := newOutbox(t, pool)
	ctx := context.Background()
	a, err := iss.Acquire(ctx, "R", "A", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Worker A, paused inside its transaction after EnqueueTx.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := ob.EnqueueTx(ctx, tx, emailIntent("R", a.Epoch, "paused")); err != nil {
		t.Fatal(err)
	}

	// A generous outer deadline: without the bound these calls would wait
	// for the transaction forever.
	busy := func(what string, call func(context.Context) error) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		err := call(cctx)
		var be *lease.BusyError
		if !errors.As(err, &be) || !errors.Is(err, lease.ErrBusy) || be.Resource != "R" || cctx.Err() != nil {
			t.Fatalf("%s while R's control row is locked = %v (ctx %v); want *BusyError naming R, before the outer deadline", what, err, cctx.Err())
		}
		if !strings.Contains(err.Error(), "locked by an open transaction") || !strings.Contains(err.Error(), "retry") {
			t.Fatalf("%s: message %q should say the control row is locked by an open transaction, and to retry", what, err)
		}
	}
	busy("acquire by another holder", func(c context.Context) error { _, err := iss.Acquire(c, "R", "B", time.Hour); return err })
	busy("advance", func(c context.Context) error { _, err := iss.Advance(c, "R", a.Epoch+10); return err })
	busy("renew", func(c context.Context) error { _, err := iss.Renew(c, "R", "A", a.Epoch, time.Hour); return err })
	busy("release", func(c context.Context) error { return iss.Release(c, "R", "A", a.Epoch) })
	// Other resources are not affected.
	if _, err := iss.Acquire(ctx, "other", "B", time.Hour); err != nil {
		t.Fatalf("acquire of another resource: %v", err)
	}

	// The worker wakes and commits; the takeover goes through and fences it.
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	expire(t, pool, "R")
	b, err := iss.Acquire(ctx, "R", "B", time.Hour)
	if err != nil || b.Epoch != a.Epoch+1 {
		t.Fatalf("acquire after the transaction ended = %+v, %v; want epoch %d", b, err, a.Epoch+1)
	}
	if _, err := ob.Enqueue(ctx, emailIntent("R", a.Epoch, "late")); !errors.Is(err, outbox.ErrStaleEpoch) {
		t.Fatalf("A's next write = %v; want stale", err)
	}
}
