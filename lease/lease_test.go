package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
)

func TestAcquireHeldExpireTakeover(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ctx := context.Background()

	a, err := iss.Acquire(ctx, "report", "A", 10*time.Second)
	if err != nil || a.Epoch != 1 {
		t.Fatalf("first acquire = %+v, %v; want epoch 1", a, err)
	}
	// Same holder while live: every grant is a new epoch.
	again, err := iss.Acquire(ctx, "report", "A", 10*time.Second)
	if err != nil || again.Epoch != 2 {
		t.Fatalf("re-acquire by holder = %+v, %v; want epoch 2", again, err)
	}
	_, err = iss.Acquire(ctx, "report", "B", 10*time.Second)
	var held *lease.HeldError
	if !errors.As(err, &held) || !errors.Is(err, lease.ErrHeld) || held.Holder != "A" || held.Epoch != 2 || held.ExpiresAt.IsZero() {
		t.Fatalf("acquire by B while A holds = %v; want *HeldError naming A, epoch 2", err)
	}
	expire(t, pool, "report")
	b, err := iss.Acquire(ctx, "report", "B", 10*time.Second)
	if err != nil || b.Epoch != 3 {
		t.Fatalf("acquire by B after expiry = %+v, %v; want epoch 3", b, err)
	}
	// A renews with its old epochs: stale.
	for _, old := range []int64{1, 2} {
		_, err = iss.Renew(ctx, "report", "A", old, 10*time.Second)
		var stale *lease.StaleEpochError
		if !errors.As(err, &stale) || stale.Current != 3 || stale.Supplied != old {
			t.Fatalf("renew by A with epoch %d after takeover = %v; want stale (%d vs 3)", old, err, old)
		}
	}
	// A's own expired lease, re-acquired by A after takeover: held by B.
	if _, err := iss.Acquire(ctx, "report", "A", 10*time.Second); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("acquire by A while B holds = %v; want ErrHeld", err)
	}
}

func TestRenew(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ctx := context.Background()
	l, err := iss.Acquire(ctx, "r", "A", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r, err := iss.Renew(ctx, "r", "A", l.Epoch, time.Hour)
	if err != nil || r.Epoch != l.Epoch || !r.ExpiresAt.After(l.ExpiresAt.Add(30*time.Minute)) {
		t.Fatalf("renew = %+v, %v; want same epoch, later expiry", r, err)
	}
	if _, err := iss.Renew(ctx, "r", "B", l.Epoch, time.Second); !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("renew by another holder = %v; want ErrStaleEpoch", err)
	}
	if _, err := iss.Renew(ctx, "r", "A", l.Epoch+1, time.Second); !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("renew with a future epoch = %v; want ErrStaleEpoch", err)
	}
	if _, err := iss.Renew(ctx, "never-used", "A", 1, time.Second); !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("renew of unknown resource = %v; want ErrStaleEpoch", err)
	}
	// Expired but not taken over: the epoch is still current, renew works.
	expire(t, pool, "r")
	if _, err := iss.Renew(ctx, "r", "A", l.Epoch, time.Second); err != nil {
		t.Fatalf("renew after expiry without takeover = %v; want ok", err)
	}
}

func TestReleaseKeepsEpoch(t *testing.T) {
	t.Parallel()
	iss, _ := setup(t)
	ctx := context.Background()
	l, _ := iss.Acquire(ctx, "r", "A", time.Hour)
	if err := iss.Release(ctx, "r", "B", l.Epoch); !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("release by another holder = %v; want ErrStaleEpoch", err)
	}
	if err := iss.Release(ctx, "r", "A", l.Epoch); err != nil {
		t.Fatal(err)
	}
	if err := iss.Release(ctx, "r", "A", l.Epoch); err != nil {
		t.Fatalf("second release = %v; want idempotent ok", err)
	}
	// A lease already free at the current epoch: a release is a no-op
	// that succeeds whoever asks (docs/guarantees.md, invariant L).
	if err := iss.Release(ctx, "r", "B", l.Epoch); err != nil {
		t.Fatalf("release of a free lease by another holder = %v; want a no-op", err)
	}
	if _, err := iss.Renew(ctx, "r", "A", l.Epoch, time.Second); !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("renew after release = %v; want ErrStaleEpoch", err)
	}
	b, err := iss.Acquire(ctx, "r", "B", time.Hour)
	if err != nil || b.Epoch != l.Epoch+1 {
		t.Fatalf("acquire after release = %+v, %v; want epoch %d", b, err, l.Epoch+1)
	}
	if err := iss.Release(ctx, "r", "A", l.Epoch); !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("release of an old epoch = %v; want ErrStaleEpoch", err)
	}
}

func TestAdvance(t *testing.T) {
	t.Parallel()
	iss, _ := setup(t)
	ctx := context.Background()
	r, err := iss.Advance(ctx, "ext", 40)
	if err != nil || r.Epoch != 40 {
		t.Fatalf("advance on first use = %+v, %v; want 40", r, err)
	}
	if r, err := iss.Advance(ctx, "ext", 40); err != nil || r.Epoch != 40 {
		t.Fatalf("advance to equal = %+v, %v; want no-op 40", r, err)
	}
	_, err = iss.Advance(ctx, "ext", 39)
	var stale *lease.StaleEpochError
	if !errors.As(err, &stale) || stale.Current != 40 || stale.Supplied != 39 {
		t.Fatalf("advance to lower = %v; want stale 39 vs 40", err)
	}
	// A lease held here is cleared by an external advance.
	l, _ := iss.Acquire(ctx, "ext", "A", time.Hour)
	if l.Epoch != 41 {
		t.Fatalf("acquire after advance: epoch %d, want 41", l.Epoch)
	}
	if _, err := iss.Advance(ctx, "ext", 50); err != nil {
		t.Fatal(err)
	}
	got, _ := iss.Get(ctx, "ext")
	if got.Epoch != 50 || got.Holder != "" {
		t.Fatalf("after advance over a lease: %+v; want epoch 50, no holder", got)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ctx := context.Background()
	long := string(make([]byte, 300))
	for _, tc := range []struct {
		name, field string
		call        func() error
	}{
		{"empty resource", "resource", func() error { _, err := iss.Acquire(ctx, "", "A", time.Second); return err }},
		{"long resource", "resource", func() error { _, err := iss.Acquire(ctx, long, "A", time.Second); return err }},
		{"empty holder", "holder", func() error { _, err := iss.Acquire(ctx, "r", "", time.Second); return err }},
		{"zero ttl", "ttl", func() error { _, err := iss.Acquire(ctx, "r", "A", 0); return err }},
		{"huge ttl", "ttl", func() error { _, err := iss.Acquire(ctx, "r", "A", 48*time.Hour); return err }},
		{"renew epoch 0", "epoch", func() error { _, err := iss.Renew(ctx, "r", "A", 0, time.Second); return err }},
		{"advance epoch 0", "epoch", func() error { _, err := iss.Advance(ctx, "r", 0); return err }},
		{"advance negative", "epoch", func() error { _, err := iss.Advance(ctx, "r", -5); return err }},
		{"release epoch 0", "epoch", func() error { return iss.Release(ctx, "r", "A", 0) }},
		{"advance above MaxEpoch", "epoch", func() error { _, err := iss.Advance(ctx, "r", lease.MaxEpoch+1); return err }},
		{"renew above MaxEpoch", "epoch", func() error { _, err := iss.Renew(ctx, "r", "A", lease.MaxEpoch+1, time.Second); return err }},
		{"release above MaxEpoch", "epoch", func() error { return iss.Release(ctx, "r", "A", lease.MaxEpoch+1) }},
	} {
		err := tc.call()
		var inv *lease.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("%s: err = %v; want InvalidError on %q", tc.name, err, tc.field)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.resources`)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("resources after bad input: %d (%v); want 0", n, err)
	}
}

// The trigger refuses an epoch going back even if code tried.
func TestEpochNeverDecreasesInSchema(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ctx := context.Background()
	if _, err := iss.Advance(ctx, "r", 10); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.resources SET epoch = 9 WHERE resource_id = 'r'`)); err == nil {
		t.Fatal("lowering an epoch by SQL succeeded; the trigger must refuse it")
	}
}

func TestKeeperRenewsAndLoses(t *testing.T) {
	t.Parallel()
	iss, _ := setup(t)
	ctx := context.Background()
	// 1.5 s: a renewal (three durable round trips) must fit in the trust
	// window's slack (TTL/3 between renewals, TTL/10 margin) on a loaded
	// shared machine; at 600 ms it lost healthy leases under load.
	const ttl = 1500 * time.Millisecond
	k, err := iss.Hold(ctx, "k", "A", lease.KeeperConfig{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	// Alive well past one TTL: the renewals work.
	select {
	case <-k.Context().Done():
		t.Fatalf("keeper lost a healthy lease: %v", k.Err())
	case <-time.After(3 * ttl):
	}
	// Takeover by an external epoch: the next renewal fails and the context
	// is cancelled, at the latest when trust runs out.
	if _, err := iss.Advance(ctx, "k", k.Epoch()+1); err != nil {
		t.Fatal(err)
	}
	if err := keeperEnds(t, k, 5*ttl, "the takeover"); !errors.Is(err, lease.ErrLeaseLost) || !errors.Is(err, lease.ErrStaleEpoch) {
		t.Fatalf("keeper cause = %v; want ErrLeaseLost wrapping ErrStaleEpoch", err)
	}
}

// A lease handed to Keep some time after its grant is renewed on the
// grant's clock: the first renewal is due RenewEvery after grantedAt, not
// after Keep, so a grant older than RenewEvery is renewed at once instead
// of running into its deadline first. (A slow Acquire inside Hold, whose
// round trip counts from before the request, is the same case.)
func TestKeepRenewsOnTheGrantsClock(t *testing.T) {
	t.Parallel()
	iss, _ := setup(t)
	ctx := context.Background()
	// Trust window 5.4 s (margin TTL/10), renewals every 2 s. Granted 4 s
	// "ago": the deadline is 1.4 s away, the first renewal overdue. Timed
	// from Keep, the first renewal would start at 2 s, after the deadline.
	const ttl = 6 * time.Second
	l, err := iss.Acquire(ctx, "old-grant", "A", ttl)
	if err != nil {
		t.Fatal(err)
	}
	grantedAt := time.Now().Add(-4 * time.Second) // earlier than the truth: a safe lie
	k, err := iss.Keep(ctx, l, grantedAt, lease.KeeperConfig{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	deadline := time.NewTimer(3 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for k.Lease().ExpiresAt.Equal(l.ExpiresAt) {
		select {
		case <-k.Context().Done():
			t.Fatalf("the keeper lost its lease before renewing it once: %v", k.Err())
		case <-deadline.C:
			t.Fatal("no renewal within 3 s of Keep")
		case <-tick.C:
		}
	}
	if err := k.Err(); err != nil {
		t.Fatalf("renewed, yet the keeper's context ended: %v", err)
	}
}

// When renewals cannot get through, the context ends by the monotonic
// deadline (TTL - margin after the last grant), not later.
func TestKeeperDeadlineWithoutRenewals(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ctx := context.Background()
	const ttl = 500 * time.Millisecond
	start := time.Now()
	l, err := iss.Acquire(ctx, "d", "A", ttl)
	if err != nil {
		t.Fatal(err)
	}
	// RenewEvery just under the trust window: the first renewal starts at
	// 440ms and a renewal blocked past the deadline never counts.
	k, err := iss.Keep(ctx, l, start, lease.KeeperConfig{TTL: ttl, RenewEvery: 449 * time.Millisecond, Margin: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	// Hold the control row locked so renewals block.
	testdb.LockControlRow(t, pool, "d")
	err = keeperEnds(t, k, 5*time.Second, "renewals blocked")
	if el := time.Since(start); el > ttl {
		t.Fatalf("lease distrusted after %s; want before the TTL %s", el, ttl)
	}
	if !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("cause = %v; want ErrLeaseLost", err)
	}
}

// An issuer without a pool — NewIssuer(nil), a zero Issuer{}, a nil
// *Issuer — grants nothing: every call is refused, naming pool, where it
// panicked on a nil pointer. A Keeper that Hold or Keep did not make
// keeps no lease: Err names keeper and its Context is done, where Err
// panicked.
func TestWithoutPoolRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := lease.KeeperConfig{TTL: time.Minute}
	for name, iss := range map[string]*lease.Issuer{"NewIssuer(nil)": lease.NewIssuer(nil), "Issuer{}": {}, "nil": nil} {
		calls := map[string]func() error{
			"Acquire": func() error { _, err := iss.Acquire(ctx, "r", "A", time.Minute); return err },
			"Renew":   func() error { _, err := iss.Renew(ctx, "r", "A", 1, time.Minute); return err },
			"Release": func() error { return iss.Release(ctx, "r", "A", 1) },
			"Advance": func() error { _, err := iss.Advance(ctx, "r", 2); return err },
			"Get":     func() error { _, err := iss.Get(ctx, "r"); return err },
			"History": func() error { _, err := iss.History(ctx, "r", 0); return err },
			"Hold":    func() error { _, err := iss.Hold(ctx, "r", "A", cfg); return err },
			"Keep": func() error {
				_, err := iss.Keep(ctx, lease.Lease{Resource: "r", Holder: "A", Epoch: 1}, time.Now(), cfg)
				return err
			},
		}
		for call, f := range calls {
			t.Run(name+"."+call, func(t *testing.T) {
				coretest.Refused(t, map[string]func() error{"pool": f})
			})
		}
	}
	// CheckPrimary with no database panicked on the nil interface (or
	// inside pgx on a nil pool).
	coretest.Refused(t, map[string]func() error{
		"db": func() error { return lease.CheckPrimary(ctx, nil) },
	})
	coretest.Refused(t, map[string]func() error{
		"db": func() error { return lease.CheckPrimary(ctx, (*pgxpool.Pool)(nil)) },
	})
	var k lease.Keeper
	coretest.Refused(t, map[string]func() error{"keeper": k.Err})
	if k.Context().Err() == nil || !errors.Is(context.Cause(k.Context()), k.Err()) {
		t.Fatalf("a zero Keeper's Context is live (%v, cause %v)", k.Context().Err(), context.Cause(k.Context()))
	}
	k.Stop()
}

// A bad KeeperConfig is refused by Hold (before it grants an epoch) and
// Keep naming the Go field — TTL, Margin, RenewEvery, PauseLogFraction —
// and a bad Margin as Margin (it named "ttl", "renew_every", "margin", and
// a Margin longer than the TTL as renew_every).
func TestKeeperConfigNamesTheField(t *testing.T) {
	t.Parallel()
	iss, _ := setup(t)
	ctx := context.Background()
	for _, c := range []struct {
		field string
		cfg   lease.KeeperConfig
	}{
		{"TTL", lease.KeeperConfig{}},
		{"TTL", lease.KeeperConfig{TTL: 48 * time.Hour}},
		{"Margin", lease.KeeperConfig{TTL: time.Second, Margin: 2 * time.Second}},
		{"Margin", lease.KeeperConfig{TTL: time.Second, Margin: -time.Millisecond}},
		{"RenewEvery", lease.KeeperConfig{TTL: time.Second, RenewEvery: time.Second}},
		{"RenewEvery", lease.KeeperConfig{TTL: time.Second, RenewEvery: -time.Millisecond}},
		{"PauseLogFraction", lease.KeeperConfig{TTL: time.Second, PauseLogFraction: -1}},
	} {
		coretest.Refused(t, map[string]func() error{c.field: func() error { _, err := iss.Hold(ctx, "kc", "A", c.cfg); return err }})
		coretest.Refused(t, map[string]func() error{c.field: func() error {
			_, err := iss.Keep(ctx, lease.Lease{Resource: "kc", Holder: "A", Epoch: 1, ExpiresAt: time.Now().Add(time.Minute)}, time.Now(), c.cfg)
			return err
		}})
	}
	if r, err := iss.Get(ctx, "kc"); err != nil || r.Epoch != 0 {
		t.Fatalf("resource after refused Holds = %+v, %v; want no epoch granted", r, err)
	}
}

// Keep never trusts a lease past its own expiry: given a KeeperConfig
// whose TTL is longer than the time the lease has left, it trusts the
// lease until that ends (by PostgreSQL's clock, less the Margin) and
// renews it before then. A lease granted for 1 s and kept with TTL 1 h was
// trusted for 54 min, long after the database had let it expire.
func TestKeepTrustsNoLongerThanTheLease(t *testing.T) {
	t.Parallel()
	iss, pool := setup(t)
	ctx := context.Background()

	// 1 s left, a margin of 6 min (TTL/10): never trusted at all.
	start := time.Now()
	l, err := iss.Acquire(ctx, "short", "A", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	k, err := iss.Keep(ctx, l, start, lease.KeeperConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	if err := keeperEnds(t, k, 5*time.Second, "a lease granted for 1 s, kept with TTL 1h"); !errors.Is(err, lease.ErrLeaseLost) {
		t.Fatalf("cause = %v; want ErrLeaseLost", err)
	}
	if el := time.Since(start); el >= time.Second {
		t.Fatalf("trusted for %s, past the lease's expiry (1 s)", el)
	}

	// 3 s left, a margin of 300 ms: trusted until 2.7 s at most, and
	// renewed (for the TTL, 1 min) halfway there, long before RenewEvery
	// (20 s) — kept, past the 3 s it was granted for.
	cfg := lease.KeeperConfig{TTL: time.Minute, Margin: 300 * time.Millisecond, RenewEvery: 20 * time.Second, PauseTick: -1}
	start = time.Now()
	l, err = iss.Acquire(ctx, "renewed", "A", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := iss.Keep(ctx, l, start, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Stop()
	select {
	case <-k2.Context().Done():
		t.Fatalf("lost a lease it could renew: %v", k2.Err())
	case <-time.After(4 * time.Second):
	}
	if r, err := iss.Get(ctx, "renewed"); err != nil || !r.LeaseLive || r.Epoch != l.Epoch {
		t.Fatalf("resource after 4 s = %+v, %v; want the lease live, renewed", r, err)
	}

	// The same, with renewals blocked: distrusted before the 3 s end.
	start = time.Now()
	l, err = iss.Acquire(ctx, "blocked", "A", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	testdb.LockControlRow(t, pool, "blocked")
	k3, err := iss.Keep(ctx, l, start, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer k3.Stop()
	if err := keeperEnds(t, k3, 10*time.Second, "renewals blocked"); !errors.Is(err, lease.ErrLeaseLost) || !strings.Contains(err.Error(), "the lease's own expiry") {
		t.Fatalf("cause = %v; want ErrLeaseLost by the lease's own expiry", err)
	}
	if el := time.Since(start); el >= 3*time.Second {
		t.Fatalf("trusted for %s with renewals blocked, past the lease's expiry (3 s)", el)
	}

	// A Lease that is not one (a zero Lease) is refused, naming the field.
	coretest.Refused(t, map[string]func() error{
		"resource": func() error { _, err := iss.Keep(ctx, lease.Lease{}, time.Now(), cfg); return err },
		"expires_at": func() error {
			_, err := iss.Keep(ctx, lease.Lease{Resource: "r", Holder: "A", Epoch: 1}, time.Now(), cfg)
			return err
		},
	})
}
