package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// op is one completed operation of the race test, timed on the monotonic
// clock of this process.
type op struct {
	resource   string
	epoch      int64
	start, end time.Time
	accepted   bool
	worker     int
	opID       string
}

// No read-then-write race: takeovers (Acquire after expiry, and Advance) and
// enqueues run concurrently on a few resources. Workers enqueue with an
// epoch they read earlier (as a paused worker would). Afterwards a checker
// proves: no accepted intent carries an epoch lower than one whose grant
// completed before that enqueue started — in real time, as an outside
// observer sees it. With the epoch check outside the enqueue's transaction
// this fails (see the note in the README).
func TestNoStaleEnqueueUnderConcurrentTakeovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	resources := []string{"res-0", "res-1", "res-2"}
	installGrantLog(t, b)
	duration := 3 * time.Second
	if testing.Short() {
		duration = time.Second
	}
	stop := time.Now().Add(duration)

	var mu sync.Mutex
	var grants, enqueues []op
	record := func(list *[]op, o op) {
		mu.Lock()
		*list = append(*list, o)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	errc := make(chan error, 64)

	// Takeover goroutines: short leases acquired by rotating holders, and
	// external advances.
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; time.Now().Before(stop); i++ {
				res := resources[rng.IntN(len(resources))]
				start := time.Now()
				var epoch int64
				var err error
				if w%2 == 0 {
					var l lease.Lease
					l, err = b.issuer.Acquire(ctx, res, fmt.Sprintf("holder-%d-%d", w, i), 10*time.Millisecond)
					epoch = l.Epoch
				} else {
					var cur lease.Resource
					cur, err = b.issuer.Get(ctx, res)
					if err == nil {
						var r lease.Resource
						r, err = b.issuer.Advance(ctx, res, cur.Epoch+1+int64(rng.IntN(2)))
						epoch = r.Epoch
					}
				}
				end := time.Now()
				switch {
				case err == nil:
					record(&grants, op{resource: res, epoch: epoch, start: start, end: end, accepted: true})
				case errors.Is(err, lease.ErrHeld) || errors.Is(err, lease.ErrStaleEpoch):
				default:
					errc <- err
					return
				}
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			}
		}()
	}
	// Enqueue goroutines: read the epoch, maybe pause, then enqueue with it.
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for i := 0; time.Now().Before(stop); i++ {
				res := resources[rng.IntN(len(resources))]
				cur, err := b.issuer.Get(ctx, res)
				if err != nil {
					errc <- err
					return
				}
				if cur.Epoch == 0 {
					continue
				}
				if rng.IntN(2) == 0 {
					time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond) // a pause
				}
				opID := fmt.Sprintf("w%d-%d", w, i)
				start := time.Now()
				_, err = b.client.Enqueue(ctx, emailIntent(res, cur.Epoch, opID))
				end := time.Now()
				switch {
				case err == nil:
					record(&enqueues, op{resource: res, epoch: cur.Epoch, start: start, end: end, accepted: true, worker: w, opID: opID})
				case errors.Is(err, outbox.ErrStaleEpoch):
					record(&enqueues, op{resource: res, epoch: cur.Epoch, start: start, end: end, worker: w, opID: opID})
				default:
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("unexpected error: %v", err)
	}

	accepted, rejected := 0, 0
	for _, e := range enqueues {
		if e.accepted {
			accepted++
		} else {
			rejected++
		}
	}
	t.Logf("grants %d, enqueues accepted %d, rejected stale %d", len(grants), accepted, rejected)
	if len(grants) < 20 || accepted < 20 || rejected < 5 {
		t.Fatalf("too little contention to prove anything: grants %d, accepted %d, rejected %d", len(grants), accepted, rejected)
	}
	if v := checkNoStaleAccepted(grants, enqueues); len(v) > 0 {
		for _, s := range v[:min(len(v), 10)] {
			t.Error(s)
		}
		t.Fatalf("%d accepted enqueues carried an epoch older than a grant completed before they started", len(v))
	}

	// The stronger check, in commit order: when each intent committed, its
	// epoch was the resource's current epoch.
	if v := checkCommitOrder(t, b); len(v) > 0 {
		for _, s := range v[:min(len(v), 10)] {
			t.Error(s)
		}
		t.Fatalf("%d intents committed with an epoch that was no longer current at commit", len(v))
	}

	// The outbox holds exactly the accepted enqueues, each with its epoch.
	rows, err := b.pool.Query(ctx, `SELECT resource_id, operation_id, epoch FROM intents`)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]int64{}
	for rows.Next() {
		var res, opID string
		var epoch int64
		if err := rows.Scan(&res, &opID, &epoch); err != nil {
			t.Fatal(err)
		}
		stored[res+"/"+opID] = epoch
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, e := range enqueues {
		epoch, ok := stored[e.resource+"/"+e.opID]
		if e.accepted != ok || (ok && epoch != e.epoch) {
			t.Fatalf("enqueue %s/%s accepted=%v but stored=%v (epoch %d vs %d)", e.resource, e.opID, e.accepted, ok, epoch, e.epoch)
		}
	}
	if len(stored) != accepted {
		t.Fatalf("stored %d intents, %d accepted", len(stored), accepted)
	}
}

// checkNoStaleAccepted returns a description of every accepted enqueue whose
// epoch is below the highest epoch granted (on its resource) by a grant that
// completed before the enqueue started.
func checkNoStaleAccepted(grants, enqueues []op) []string {
	byRes := map[string][]op{}
	for _, g := range grants {
		byRes[g.resource] = append(byRes[g.resource], g)
	}
	// Per resource: grants sorted by completion, with a running max epoch.
	type prefix struct {
		ends []time.Time
		max  []int64
	}
	idx := map[string]prefix{}
	for res, gs := range byRes {
		sort.Slice(gs, func(i, j int) bool { return gs[i].end.Before(gs[j].end) })
		p := prefix{}
		var m int64
		for _, g := range gs {
			m = max(m, g.epoch)
			p.ends = append(p.ends, g.end)
			p.max = append(p.max, m)
		}
		idx[res] = p
	}
	var violations []string
	for _, e := range enqueues {
		if !e.accepted {
			continue
		}
		p := idx[e.resource]
		// Number of grants that ended strictly before e started.
		n := sort.Search(len(p.ends), func(i int) bool { return !p.ends[i].Before(e.start) })
		if n > 0 && e.epoch < p.max[n-1] {
			violations = append(violations, fmt.Sprintf("%s/%s: accepted epoch %d, but epoch %d was granted before it started",
				e.resource, e.opID, e.epoch, p.max[n-1]))
		}
	}
	return violations
}

// installGrantLog records every epoch change of a resource in a log table
// (test-only), so the commit order of grants and intents can be compared.
func installGrantLog(t *testing.T, b bundle) {
	t.Helper()
	ctx := context.Background()
	var on string
	if err := b.pool.QueryRow(ctx, `SHOW track_commit_timestamp`).Scan(&on); err != nil || on != "on" {
		t.Fatalf("this test needs track_commit_timestamp=on on the test server (the test command sets it); got %q (%v)", on, err)
	}
	_, err := b.pool.Exec(ctx, `
		CREATE TABLE grant_log (resource_id text NOT NULL, epoch bigint NOT NULL);
		CREATE FUNCTION log_grant() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.epoch > 0 AND (TG_OP = 'INSERT' OR NEW.epoch <> OLD.epoch) THEN
				INSERT INTO grant_log VALUES (NEW.resource_id, NEW.epoch);
			END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER log_grant AFTER INSERT OR UPDATE ON resources FOR EACH ROW EXECUTE FUNCTION log_grant();`)
	if err != nil {
		t.Fatal(err)
	}
}

// checkCommitOrder verifies invariant I1 from commit timestamps: for every
// intent, the highest epoch granted by a transaction that committed before
// the intent's transaction is the intent's own epoch.
func checkCommitOrder(t *testing.T, b bundle) []string {
	t.Helper()
	ctx := context.Background()
	type ev struct {
		res   string
		epoch int64
		ts    time.Time
		grant bool
		opID  string
	}
	var evs []ev
	load := func(q string, grant bool) {
		rows, err := b.pool.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			e := ev{grant: grant}
			if err := rows.Scan(&e.res, &e.epoch, &e.ts, &e.opID); err != nil {
				t.Fatal(err)
			}
			evs = append(evs, e)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	load(`SELECT resource_id, epoch, pg_xact_commit_timestamp(xmin), '' FROM grant_log`, true)
	load(`SELECT resource_id, epoch, pg_xact_commit_timestamp(xmin), operation_id FROM intents`, false)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].ts.Before(evs[j].ts) })
	current := map[string]int64{}
	var violations []string
	for i, e := range evs {
		if e.grant {
			current[e.res] = max(current[e.res], e.epoch)
			continue
		}
		// A grant with the very same commit timestamp is unordered against
		// this intent: skip the comparison rather than guess.
		tie := (i > 0 && evs[i-1].ts.Equal(e.ts)) || (i+1 < len(evs) && evs[i+1].ts.Equal(e.ts))
		if !tie && e.epoch != current[e.res] {
			violations = append(violations, fmt.Sprintf("intent %s/%s committed with epoch %d while the current epoch was %d",
				e.res, e.opID, e.epoch, current[e.res]))
		}
	}
	return violations
}
