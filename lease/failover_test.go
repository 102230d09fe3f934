package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
)

// A failover to an asynchronous standby that had not received the last
// grants: the old primary granted epochs the standby never saw, the
// standby is promoted, and every grant on it must still be above every
// epoch the old primary granted (before the fix, the promoted standby
// handed out the same epochs again: two holders with one token).
func TestFailoverToLaggingStandby(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs := startReplicated(t, ctx)
	primary, ppool, standby, spool := rs.primary, rs.ppool, rs.standby, rs.spool
	piss := lease.NewIssuer(ppool, lease.WithSchema(testdb.Schema()))
	// Granted and replicated before the lag: b stays untouched on the
	// primary afterwards.
	for _, r := range []string{"a", "b"} {
		if _, err := piss.Acquire(ctx, r, "A", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	replayedUpTo := func(lsn string) func() (bool, error) {
		return func() (bool, error) {
			var ok bool
			err := spool.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, lsn).Scan(&ok)
			return ok, err
		}
	}
	var lsn string
	if err := ppool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "standby replays the schema and the first grants", time.Minute, replayedUpTo(lsn))

	// The lag. Pausing replay alone is not enough: a promotion first
	// replays all the WAL the standby received (checked: with replay
	// paused and the grants below received, the promoted standby had
	// them), so the grants below must not reach the standby at all. Its
	// WAL receiver is stopped (primary_conninfo cleared), then replay is
	// paused: the standby has neither received nor replayed what the
	// primary grants next, as when an asynchronous primary dies with
	// commits its standby never got.
	if _, err := spool.Exec(ctx, `ALTER SYSTEM SET primary_conninfo = ''`); err != nil {
		t.Fatal(err)
	}
	if _, err := spool.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the standby's WAL receiver stops", 30*time.Second, func() (bool, error) {
		var n int
		err := spool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_wal_receiver`).Scan(&n)
		return n == 0, err
	})
	if _, err := spool.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "replay paused", 30*time.Second, func() (bool, error) {
		var state string
		err := spool.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state)
		return state == "paused", err
	})

	// Grants on the primary that the standby never gets: a's epoch grows,
	// c is a resource the standby has never heard of, d is advanced by an
	// outside lock service.
	granted := map[string]int64{}
	for range 5 {
		l, err := piss.Acquire(ctx, "a", "A", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		granted["a"] = l.Epoch
	}
	for range 3 {
		l, err := piss.Acquire(ctx, "c", "B", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		granted["c"] = l.Epoch
	}
	if _, err := piss.Advance(ctx, "d", 100); err != nil {
		t.Fatal(err)
	}
	granted["d"] = 100
	if b, err := piss.Get(ctx, "b"); err != nil {
		t.Fatal(err)
	} else {
		granted["b"] = b.Epoch
	}
	// The standby lags: it shows a's older epoch and knows nothing of c.
	sA, err := lease.NewIssuer(spool, lease.WithSchema(testdb.Schema())).Get(ctx, "a")
	if err != nil || sA.Epoch >= granted["a"] {
		t.Fatalf("standby's a = %+v, %v; want an epoch below the primary's %d (the standby must lag)", sA, err, granted["a"])
	}
	if sC, err := lease.NewIssuer(spool, lease.WithSchema(testdb.Schema())).Get(ctx, "c"); err != nil || sC.Epoch != 0 {
		t.Fatalf("standby's c = %+v, %v; want no epoch (never replicated)", sC, err)
	}

	// The old primary dies, the standby is promoted.
	if err := primary.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	var promoted bool
	if err := spool.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&promoted); err != nil || !promoted {
		t.Fatalf("pg_promote = %v, %v", promoted, err)
	}
	// Promotion ends the paused replay: what the standby had received is
	// applied first, and that still does not include the grants above.
	if sA, err := lease.NewIssuer(spool, lease.WithSchema(testdb.Schema())).Get(ctx, "a"); err != nil || sA.Epoch >= granted["a"] {
		t.Fatalf("promoted standby's a = %+v, %v; want it still below %d", sA, err, granted["a"])
	}

	// The first grants after the promotion, several at once: each is above
	// every epoch the old primary granted for its resource, and exactly one
	// of them raised the epochs (by the jump of 1000).
	const jump = 1000
	npool := requirePrimaryPool(t, standby.URL("postgres"))
	niss := lease.NewIssuer(npool, lease.WithSchema(testdb.Schema()), lease.WithFailoverEpochJump(jump))
	var wg sync.WaitGroup
	got := map[string]int64{}
	var mu sync.Mutex
	for _, r := range []string{"a", "b", "c", "d"} {
		wg.Go(func() {
			l, err := niss.Acquire(ctx, r, "A", time.Minute)
			if err != nil {
				t.Errorf("acquire %s after promotion: %v", r, err)
				return
			}
			mu.Lock()
			got[r] = l.Epoch
			mu.Unlock()
		})
	}
	wg.Wait()
	for r, g := range granted {
		if got[r] <= g {
			t.Errorf("after the failover %s got epoch %d; the old primary already granted %d: two holders with one token", r, got[r], g)
		}
	}
	// Exactly: the standby's epoch + the jump + 1 (a and b: 1 each on the
	// standby); c and d, never seen here, start from the floor (the jump).
	want := map[string]int64{"a": sA.Epoch + jump + 1, "b": 1 + jump + 1, "c": jump + 1, "d": jump + 1}
	for r, w := range want {
		if got[r] != w {
			t.Errorf("after the failover %s got epoch %d, want %d (one jump of %d)", r, got[r], w, jump)
		}
	}
	var tli, floor, lastJump int64
	if err := npool.QueryRow(ctx, testdb.SQL(`SELECT timeline_id, epoch_floor, last_jump FROM fencegate.epoch_authority`)).Scan(&tli, &floor, &lastJump); err != nil {
		t.Fatal(err)
	}
	if tli != 2 || floor != jump || lastJump != jump {
		t.Errorf("epoch_authority = timeline %d, floor %d, last jump %d; want 2, %d, %d", tli, floor, lastJump, jump, jump)
	}
	// The raise is in the history, with the lease it cleared; the grant
	// after it found nobody holding the raised epoch.
	hist, err := niss.History(ctx, "a", 2)
	if err != nil || len(hist) != 2 {
		t.Fatalf("history of a = %+v, %v", hist, err)
	}
	if h := hist[1]; h.How != lease.HowFailover || h.Epoch != sA.Epoch+jump || h.PreviousEpoch != sA.Epoch || h.PreviousHolder != "A" || h.Holder != "" {
		t.Errorf("the failover's grant = %+v; want how failover, epoch %d, previous %d held by A", h, sA.Epoch+jump, sA.Epoch)
	}
	if h := hist[0]; h.How != lease.HowFree || h.Epoch != got["a"] {
		t.Errorf("the grant after the failover = %+v; want how free, epoch %d", h, got["a"])
	}
	// No second jump: the next grant is the next epoch.
	if l, err := niss.Acquire(ctx, "a", "A", time.Minute); err != nil || l.Epoch != got["a"]+1 {
		t.Errorf("second acquire after the failover = %+v, %v; want epoch %d", l, err, got["a"]+1)
	}
	// An outside lock service's epoch must be above the raised one too:
	// the old primary may have registered a larger one than this database
	// ever saw.
	var stale *lease.StaleEpochError
	if _, err := niss.Advance(ctx, "e", 5); !errors.As(err, &stale) || stale.Current != jump {
		t.Errorf("Advance(e, 5) after the failover = %v; want a stale epoch, current %d (the floor)", err, jump)
	}
}

// A grant on a database that is not the epoch authority on record is
// refused with ErrAuthorityChanged naming the condition, and changes
// nothing: another system identifier (a different database, a copy in
// another cluster), a lower timeline (a restore from an older backup).
func TestAuthorityChangedRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, fake, reason, message string
	}{
		{"system identifier changed", `UPDATE fencegate.epoch_authority SET system_identifier = system_identifier + 1`,
			lease.ReasonSystemIdentifierChanged, "the database's system identifier changed (recorded "},
		{"timeline went backwards", `UPDATE fencegate.epoch_authority SET timeline_id = timeline_id + 5`,
			lease.ReasonTimelineBackwards, "the database's timeline went backwards (recorded "},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			iss, pool := setup(t)
			ctx := context.Background()
			l, err := iss.Acquire(ctx, "r", "A", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, testdb.SQL(c.fake)); err != nil {
				t.Fatal(err)
			}
			for _, op := range []struct {
				name  string
				grant func() error
			}{
				{"acquire", func() error { _, err := iss.Acquire(ctx, "r", "B", time.Minute); return err }},
				{"acquire", func() error { _, err := iss.Acquire(ctx, "new", "B", time.Minute); return err }},
				{"advance", func() error { _, err := iss.Advance(ctx, "r", 50); return err }},
			} {
				err := op.grant()
				var ae *lease.AuthorityError
				if !errors.Is(err, lease.ErrAuthorityChanged) || !errors.As(err, &ae) {
					t.Fatalf("%s = %v; want ErrAuthorityChanged", op.name, err)
				}
				if ae.Reason != c.reason || ae.Op != op.name || !strings.Contains(err.Error(), c.message) ||
					!strings.Contains(err.Error(), "epoch authority changed") {
					t.Fatalf("%s: %+v: %v; want reason %s and a message naming it", op.name, ae, err, c.reason)
				}
			}
			// Nothing changed: the epoch, the lease, no new resource.
			r, err := iss.Get(ctx, "r")
			if err != nil || r.Epoch != l.Epoch || r.Holder != "A" {
				t.Fatalf("after refusals r = %+v, %v; want epoch %d held by A", r, err, l.Epoch)
			}
			var n int
			if err := pool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.resources`)).Scan(&n); err != nil || n != 1 {
				t.Fatalf("resources after refusals: %d, %v; want 1", n, err)
			}
		})
	}
}

// An operator accepts a moved or restored database by deleting the
// recorded authority: the next grant records the database and raises
// every epoch by the jump, stopping at MaxEpoch (that resource is then
// exhausted).
func TestAuthorityDeletedRaises(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	iss := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()), lease.WithFailoverEpochJump(500))
	ctx := context.Background()
	l, err := iss.Acquire(ctx, "r", "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := iss.Advance(ctx, "top", lease.MaxEpoch-10); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, testdb.SQL(`DELETE FROM fencegate.epoch_authority`)); err != nil {
		t.Fatal(err)
	}
	n, err := iss.Acquire(ctx, "other", "B", time.Minute)
	if err != nil || n.Epoch != 501 {
		t.Fatalf("first grant after the delete = %+v, %v; want epoch 501 (the floor 500 + 1)", n, err)
	}
	if r, err := iss.Get(ctx, "r"); err != nil || r.Epoch != l.Epoch+500 || r.Holder != "" {
		t.Fatalf("r after the raise = %+v, %v; want epoch %d and no holder", r, err, l.Epoch+500)
	}
	if r, err := iss.Get(ctx, "top"); err != nil || r.Epoch != lease.MaxEpoch {
		t.Fatalf("top after the raise = %+v, %v; want MaxEpoch", r, err)
	}
	var inv *lease.InvalidError
	if _, err := iss.Acquire(ctx, "top", "B", time.Minute); !errors.As(err, &inv) || inv.Field != "epoch" {
		t.Fatalf("acquire top = %v; want exhausted (invalid epoch)", err)
	}
	var rows int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.epoch_authority WHERE system_identifier = fencegate.fencegate_system_identifier()
		AND timeline_id = fencegate.fencegate_timeline_id() AND epoch_floor = 500`)).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("recorded authority rows = %d, %v; want this database with floor 500", rows, err)
	}
}
