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
