package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
)

// A Keeper's lifecycle: started once (by Hold), Stop waits for the renewal
// it has in flight, and the cause says what ended the context — Stop, the
// parent, or a lost lease, which a later Stop does not overwrite.
func TestKeeperLifecycle(t *testing.T) {
	t.Parallel()
	iss, _ := setup(t)
	ctx := context.Background()

	t.Run("StopWaitsForTheRenewalInFlight", func(t *testing.T) {
		// A pool of its own that counts the renewals in flight.
		var renewing atomic.Int64
		cfg, err := pgxpool.ParseConfig(testdb.NewURL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.Tracer = renewTracer{&renewing}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Closed after lockControlRow's transaction ends (cleanups run last
		// first): Close waits for every connection to come back.
		t.Cleanup(pool.Close)
		iss := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()))
		k, err := iss.Hold(ctx, "life-stop", "A", lease.KeeperConfig{TTL: time.Minute, RenewEvery: 20 * time.Millisecond, PauseTick: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer k.Stop()
		if err := k.StartAgain(ctx); !errors.Is(err, startstop.ErrStarted) {
			t.Fatalf("second Start = %v, want ErrStarted", err)
		}
		// Block renewals on the control row's lock and wait until one is
		// waiting for it: Stop must then wait for that renewal to end.
		testdb.LockControlRow(t, pool, "life-stop")
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var waiting int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if waiting > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no renewal ever waited for the control row's lock")
			}
		}
		began := time.Now()
		k.Stop()
		// Ended already, not soon: the blocked renewal needs a round trip
		// to PostgreSQL to be cancelled, and Stop waited for it.
		if n := renewing.Load(); n != 0 {
			t.Fatalf("%d renewals still in flight after Stop returned", n)
		}
		select {
		case <-k.Stopped():
		default:
			t.Fatal("Stop returned before the Keeper's goroutines ended")
		}
		// Cancelled, not waited out (the lock timeout is 5 s, the TTL 1 min).
		if took := time.Since(began); took > 3*time.Second {
			t.Fatalf("Stop took %s with a renewal blocked", took)
		}
		if err := k.Err(); !errors.Is(err, startstop.ErrStopped) || !errors.Is(err, context.Canceled) || errors.Is(err, lease.ErrLeaseLost) {
			t.Fatalf("cause after Stop = %v; want ErrStopped (matching context.Canceled), not lost", err)
		}
		if err := k.StartAgain(ctx); !errors.Is(err, startstop.ErrStarted) {
			t.Fatalf("Start after Stop = %v, want ErrStarted", err)
		}
		k.Stop() // idempotent
	})

	t.Run("ParentCause", func(t *testing.T) {
		pctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		k, err := iss.Hold(pctx, "life-parent", "A", lease.KeeperConfig{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer k.Stop()
		shutdown := errors.New("worker shutting down")
		cancel(shutdown)
		select {
		case <-k.Stopped():
		case <-time.After(10 * time.Second):
			t.Fatal("Stopped not closed after the parent ended")
		}
		if err := k.Err(); !errors.Is(err, shutdown) {
			t.Fatalf("cause = %v; want the parent's cause", err)
		}
		k.Stop()
		if err := k.Err(); !errors.Is(err, shutdown) {
			t.Fatalf("cause after Stop = %v; want the parent's cause still", err)
		}
		// A Keeper is not started under a context that is already done.
		if _, err := iss.Keep(pctx, k.Lease(), time.Now(), lease.KeeperConfig{TTL: time.Minute}); !errors.Is(err, context.Canceled) {
			t.Fatalf("Keep with a done context = %v; want context.Canceled", err)
		}
	})

	t.Run("LostThenStopped", func(t *testing.T) {
		k, err := iss.Hold(ctx, "life-lost", "A", lease.KeeperConfig{TTL: time.Minute, RenewEvery: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer k.Stop()
		if _, err := iss.Advance(ctx, "life-lost", k.Epoch()+1); err != nil {
			t.Fatal(err)
		}
		select {
		case <-k.Stopped(): // a lost lease ends the Keeper without Stop
		case <-time.After(10 * time.Second):
			t.Fatal("Keeper did not end after its epoch was advanced")
		}
		k.Stop()
		if err := k.Err(); !errors.Is(err, lease.ErrLeaseLost) || !errors.Is(err, lease.ErrStaleEpoch) || errors.Is(err, startstop.ErrStopped) {
			t.Fatalf("cause after loss and Stop = %v; want ErrLeaseLost wrapping ErrStaleEpoch, kept", err)
		}
	})
}

// renewTracer counts the Renew statements in flight.
type renewTracer struct{ n *atomic.Int64 }

type renewKey struct{}

func (r renewTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "UPDATE fencegate.resources r") {
		return ctx
	}
	r.n.Add(1)
	return context.WithValue(ctx, renewKey{}, true)
}

func (r renewTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(renewKey{}) != nil {
		r.n.Add(-1)
	}
}
