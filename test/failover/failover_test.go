//go:build failover

package failover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/testkit/autofailover"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	ft "github.com/fencegate/fencegate/internal/testkit/faulttest"
	"github.com/fencegate/fencegate/internal/testkit/hooktest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) { ft.Main(m) }

// EnvMutation selects a mutation the test must catch: "pinned" gives the
// adapter process the first primary's host alone instead of the
// formation's multi-host URL.
const EnvMutation = "FENCEGATE_FAILOVER_MUTATION"

const (
	// steady is the load before, between and after the faults.
	steady = 10 * time.Second
	// rate is the Go workers' enqueues per second (each), and the SQL
	// worker's.
	rate = 10
	// killBound bounds the stall of the enqueues and of the effects around
	// kill -9 of the primary: the HA manager's detection (3 s unhealthy)
	// and demote timeout (5 s), and what the gateway adds.
	killBound = 30 * time.Second
	// switchoverBound bounds the stalls around the planned switchover.
	switchoverBound = 20 * time.Second
	step            = 2 * time.Minute
)

// The failover under load. See the package doc.
func TestFailover(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	f := autofailover.Start(t, autofailover.Options{})
	t.Logf("formation up in %s: %s", time.Since(start).Round(time.Millisecond), f.URL())
	db := f.URL()
	bin := ft.Gateway(t)
	// The default schema, whatever the environment says: the test's own
	// clients and the gateway processes must agree.
	schema := pgschema.Default
	env := []string{"GATEWAY_SCHEMA=" + schema}
	ft.Expect(t, ft.Gw(t, bin, db, env, "migrate"), 0, "")

	rcv := hooktest.New(t)
	ns := natstest.Start(t)
	hostport := strings.TrimPrefix(rcv.URL(), "http://")
	adapterURL := db
	mutation := os.Getenv(EnvMutation)
	switch mutation {
	case "":
	case "pinned":
		adapterURL = f.Nodes[0].URL()
		t.Logf("MUTATION: the adapter process is pinned to %s", adapterURL)
	default:
		t.Fatalf("%s=%q: unknown mutation", EnvMutation, mutation)
	}
	relay := ft.Start(t, bin, db, env, "run", "--nats-url", ns.URL, "--adapters", "", "--poll-interval", "200ms")
	adapter := ft.Start(t, bin, adapterURL, env, "run", "--nats-url", ns.URL, "--dispatcher=false",
		"--adapters", "webhook", "--webhook-allow", hostport)
	procs := map[string]*ft.Proc{"relay": relay, "adapter": adapter}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("%s's stderr (tail):\n%s", name, tail(p.Stderr(), 4000))
			}
			for _, n := range f.Nodes {
				t.Logf("%s's log (tail):\n%s", n.Name, n.Log())
			}
		}
	})

	cfg, err := pgxpool.ParseConfig(db)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	lease.RequirePrimary(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	issuer := lease.NewIssuer(pool, lease.WithSchema(schema))

	h := &history{}
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() { goWorker(lctx, h, issuer, ob, fmt.Sprintf("go-%d", w), rcv.URL()) })
	}
	wg.Go(func() { sqlWorker(lctx, h, db, schema, "sql-0", rcv.URL()) })
	wg.Go(func() { granter(lctx, h, issuer, []string{"g-0", "g-1"}) })
	halt := func() {
		stopLoad()
		wg.Wait()
	}
	defer halt()

	poll := func(timeout time.Duration, what string, cond func() (bool, string)) {
		t.Helper()
		ft.PollRunning(t, procs, timeout, what, cond)
	}
	poll(step, "the first effect", func() (bool, string) { return rcv.Total() > 0, "none yet" })
	time.Sleep(steady)

	var faults []*fault
	// Fault 1: kill -9 the primary node with its PostgreSQL.
	old, err := f.Primary(ctx)
	if err != nil || old == nil {
		t.Fatalf("no primary: %v", err)
	}
	fl := &fault{name: "kill -9 " + old.Name + " (the primary and its keeper)", bound: killBound, start: time.Now()}
	faults = append(faults, fl)
	old.Kill()
	poll(step, "a new primary", func() (bool, string) {
		st, err := f.State(ctx)
		if err != nil {
			return false, err.Error()
		}
		for name, s := range st {
			if name != old.Name && (s == "wait_primary" || s == "primary") {
				return true, fmt.Sprint(st)
			}
		}
		return false, fmt.Sprint(st)
	})
	fl.promoted = time.Since(fl.start)
	poll(killBound, "effects after the promotion", func() (bool, string) {
		return rcv.LastAfter(fl.start.Add(fl.promoted)), "none since the promotion"
	})
	time.Sleep(steady / 2)
	// The old node rejoins as a secondary (pg_auto_failover rewinds it).
	if err := old.Run(); err != nil {
		t.Fatal(err)
	}
	rejoinStart := time.Now()
	poll(step, old.Name+" to rejoin as a secondary", func() (bool, string) {
		st, err := f.State(ctx)
		if err != nil {
			return false, err.Error()
		}
		return st[old.Name] == "secondary" && slices.Contains(mapValues(st), "primary"), fmt.Sprint(st)
	})
	t.Logf("%s rejoined as a secondary in %s", old.Name, time.Since(rejoinStart).Round(time.Millisecond))
	rejoined := time.Now()
	// With the old primary a secondary, intents must still settle.
	poll(killBound, "effects with "+old.Name+" a secondary", func() (bool, string) {
		return rcv.LastAfter(rejoined) && h.ackedAfter(rejoined), "none since the rejoin"
	})
	time.Sleep(steady)

	// Fault 2: a planned switchover back to the old node.
	fl = &fault{name: "switchover (pg_autoctl perform switchover)", bound: switchoverBound, start: time.Now()}
	faults = append(faults, fl)
	if err := f.Switchover(ctx); err != nil {
		t.Fatal(err)
	}
	fl.promoted = time.Since(fl.start)
	poll(step, "a steady formation after the switchover", func() (bool, string) {
		st, err := f.State(ctx)
		if err != nil {
			return false, err.Error()
		}
		v := mapValues(st)
		sort.Strings(v)
		return slices.Equal(v, []string{"primary", "secondary"}), fmt.Sprint(st)
	})
	time.Sleep(steady)
	halt()

	// Every acknowledged enqueue ends succeeded, once at the destination.
	acked := h.ackedIntents()
	if len(acked) < 100 {
		t.Fatalf("only %d acknowledged enqueues: too little load", len(acked))
	}
	ids := make([]int64, 0, len(acked))
	for id := range acked {
		ids = append(ids, id)
	}
	var recs map[int64]*outbox.Record
	poll(3*time.Minute, "every acknowledged intent to end", func() (bool, string) {
		var err error
		if recs, err = coretest.Records(ob, ids); err != nil {
			return false, err.Error()
		}
		var open []string
		for _, id := range ids {
			r, ok := recs[id]
			if !ok {
				return false, fmt.Sprintf("intent %d (acknowledged) is missing", id)
			}
			if !r.Status.Terminal() {
				open = append(open, describe(ctx, pool, r))
			}
		}
		return len(open) == 0, fmt.Sprintf("%d of %d not final: %s", len(open), len(ids), strings.Join(head(open), "; "))
	})
	var lost, notSucceeded, notOnce []string
	for id, key := range acked {
		r := recs[id]
		switch {
		case r == nil:
			lost = append(lost, fmt.Sprint(id))
		case r.Status != outbox.StatusSucceeded:
			notSucceeded = append(notSucceeded, fmt.Sprintf("%d %s", id, r.Status))
		case rcv.Count(key) != 1:
			notOnce = append(notOnce, fmt.Sprintf("%s: %d requests", key, rcv.Count(key)))
		}
	}
	for key, n := range rcv.Counts() {
		if n != 1 {
			notOnce = append(notOnce, fmt.Sprintf("%s: %d requests", key, n))
		}
	}
	grants, dup, behind := h.checkGrants(ctx, issuer)
	t.Logf("acknowledged: %d enqueues (%d Go, %d SQL), %d grants on %d resources; %d requests at the destination; %d enqueue and %d grant errors retried",
		len(acked), h.count("go"), h.count("sql"), grants, len(h.grantsBy()), rcv.Total(), h.errs("enqueue"), h.errs("grant"))
	if n := h.errs("authority_changed"); n > 0 {
		t.Errorf("%d grants refused as authority_changed after a failover or a switchover", n)
	}
	if grants < 20 {
		t.Errorf("only %d acknowledged grants: too little load on the grants", grants)
	}
	if len(lost) > 0 || len(notSucceeded) > 0 || len(notOnce) > 0 || len(dup) > 0 || len(behind) > 0 {
		t.Errorf("lost acknowledged intents %v; not succeeded %v; not once at the destination %v; epochs handed out twice %v; acknowledged grants lost %v",
			head(lost), head(notSucceeded), head(notOnce), head(dup), head(behind))
	}
	for i, fl := range faults {
		end := fl.start.Add(time.Minute)
		if i+1 < len(faults) {
			end = faults[i+1].start
		}
		fl.enqueueStall = h.stall(fl.start, end)
		fl.effectStall = longestGap(rcv.Times(), fl.start, end)
		t.Logf("%s: promoted after %s; enqueues stalled %s, effects stalled %s (bound %s)",
			fl.name, fl.promoted.Round(time.Millisecond), fl.enqueueStall.Round(time.Millisecond), fl.effectStall.Round(time.Millisecond), fl.bound)
		if fl.enqueueStall > fl.bound || fl.effectStall > fl.bound {
			t.Errorf("%s: a stall longer than %s", fl.name, fl.bound)
		}
	}
	t.Logf("the adapter began %d intents again after a Begin whose answer was lost",
		strings.Count(adapter.Stderr(), "begun again after a Begin whose answer was lost"))
	t.Logf("failover test in %s", time.Since(start).Round(time.Second))
}

// fault is one fault and what the test measured of it.
type fault struct {
	name  string
	bound time.Duration
	start time.Time
	// promoted: how long after start the monitor had a new primary (the
	// switchover: when its command returned).
	promoted                  time.Duration
	enqueueStall, effectStall time.Duration
}

// history is what the workers were told: every acknowledged enqueue and
// grant, with when.
type history struct {
	mu       sync.Mutex
	intents  map[int64]string // acknowledged intent → its idempotency key
	by       map[string]int   // acknowledged enqueues per worker kind
	ackTimes []time.Time
	grants   map[string][]int64
	errCount map[string]int
}

func (h *history) acked(kind string, id int64, key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.intents == nil {
		h.intents, h.by = map[int64]string{}, map[string]int{}
	}
	h.intents[id] = key
	h.by[kind]++
	h.ackTimes = append(h.ackTimes, time.Now())
}

func (h *history) granted(res string, epoch int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.grants == nil {
		h.grants = map[string][]int64{}
	}
	h.grants[res] = append(h.grants[res], epoch)
}

func (h *history) failed(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.errCount == nil {
		h.errCount = map[string]int{}
	}
	h.errCount[what]++
}

func (h *history) errs(what string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.errCount[what]
}

func (h *history) count(kind string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.by[kind]
}

func (h *history) ackedIntents() map[int64]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[int64]string, len(h.intents))
	for k, v := range h.intents {
		m[k] = v
	}
	return m
}

func (h *history) ackedAfter(t time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ackTimes) > 0 && h.ackTimes[len(h.ackTimes)-1].After(t)
}

func (h *history) grantsBy() map[string][]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := map[string][]int64{}
	for k, v := range h.grants {
		m[k] = slices.Clone(v)
	}
	return m
}

// stall is the longest gap between acknowledged enqueues from the last one
// before t up to end.
func (h *history) stall(t, end time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return longestGap(h.ackTimes, t, end)
}

// checkGrants returns the number of acknowledged grants, the epochs
// acknowledged twice on a resource, and the acknowledged grants above the
// resource's epoch now (a grant the database lost).
func (h *history) checkGrants(ctx context.Context, issuer *lease.Issuer) (int, []string, []string) {
	n := 0
	var dup, behind []string
	for res, epochs := range h.grantsBy() {
		n += len(epochs)
		seen := map[int64]bool{}
		var top int64
		for _, e := range epochs {
			if seen[e] {
				dup = append(dup, fmt.Sprintf("%s@%d", res, e))
			}
			seen[e] = true
			top = max(top, e)
		}
		cur, err := issuer.Get(ctx, res)
		if err != nil || cur.Epoch < top {
			behind = append(behind, fmt.Sprintf("%s: acknowledged %d, now %d (%v)", res, top, cur.Epoch, err))
		}
	}
	return n, dup, behind
}

// longestGap is the longest gap between consecutive times in [t, end],
// counting from the last one before t.
func longestGap(times []time.Time, t, end time.Time) time.Duration {
	times = slices.Clone(times)
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	var prev time.Time
	var longest time.Duration
	for _, x := range times {
		if x.Before(t) {
			prev = x
			continue
		}
		if x.After(end) {
			break
		}
		if !prev.IsZero() && x.Sub(prev) > longest {
			longest = x.Sub(prev)
		}
		prev = x
	}
	return longest
}

// payload is a webhook intent to the receiver, keyed key.
func payload(dest, key string, n int) []byte {
	b, _ := json.Marshal(map[string]any{
		"url":        dest + "/hook",
		"body":       map[string]any{"key": key, "n": n},
		"lookup_url": dest + "/lookup/" + url.PathEscape(key),
	})
	return b
}

// goWorker enqueues rate webhook intents a second on resource through
// the Go client, holding the resource's lease: a stale epoch (every epoch
// jumps after a failover) takes the lease again; any other error is retried
// with the same operation and epoch until it is answered.
func goWorker(ctx context.Context, h *history, issuer *lease.Issuer, ob *outbox.Client, resource, dest string) {
	var epoch int64
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for n := 1; ctx.Err() == nil; n++ {
		key := fmt.Sprintf("%s-%d", resource, n)
		for ctx.Err() == nil {
			if epoch == 0 {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				l, err := issuer.Acquire(cctx, resource, resource+"-worker", time.Hour)
				cancel()
				if err != nil {
					h.failed("grant")
					sleep(ctx, 100*time.Millisecond)
					continue
				}
				epoch = l.Epoch
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, err := ob.Enqueue(cctx, outbox.Intent{Resource: resource, Epoch: epoch, OperationID: key,
				Kind: "webhook", IdempotencyKey: key, Payload: payload(dest, key, n)})
			cancel()
			if errors.Is(err, outbox.ErrStaleEpoch) {
				// Fenced: nothing stored. A new lease, and a new
				// operation (this one may have committed under the old
				// epoch before the answer was lost: then it is not
				// acknowledged, and needs no check).
				epoch = 0
				break
			}
			if err != nil {
				if ctx.Err() == nil {
					h.failed("enqueue")
				}
				sleep(ctx, 100*time.Millisecond)
				continue
			}
			h.acked("go", res.IntentID, key)
			break
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// sqlWorker is a worker of the SQL interface (as the Python and Node.js
// examples): acquire and enqueue are SQL function calls on a connection of
// its own to the formation's multi-host URL, reconnecting after an error.
func sqlWorker(ctx context.Context, h *history, dbURL, schema, resource, dest string) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	var epoch int64
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for n := 1; ctx.Err() == nil; n++ {
		key := fmt.Sprintf("%s-%d", resource, n)
		for ctx.Err() == nil {
			if conn == nil || conn.IsClosed() {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				c, err := pgx.Connect(cctx, dbURL)
				cancel()
				if err != nil {
					h.failed("enqueue")
					sleep(ctx, 100*time.Millisecond)
					continue
				}
				conn = c
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if epoch == 0 {
				err := conn.QueryRow(cctx, `SELECT epoch FROM `+schema+`.acquire($1, $2, interval '1 hour')`, resource, resource+"-worker").Scan(&epoch)
				cancel()
				if err != nil {
					h.failed("grant")
					conn.Close(context.Background())
					conn = nil
					sleep(ctx, 100*time.Millisecond)
					continue
				}
				continue
			}
			var outcome string
			var id int64
			err := conn.QueryRow(cctx, `SELECT outcome, intent_id FROM `+schema+`.enqueue(resource => $1, epoch => $2, operation_id => $3, kind => 'webhook', payload => $4::jsonb, key => $5)`,
				resource, epoch, key, string(payload(dest, key, n)), key).Scan(&outcome, &id)
			cancel()
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "ZF002" {
				epoch = 0 // stale: a new lease, a new operation
				break
			}
			if err != nil {
				if ctx.Err() == nil {
					h.failed("enqueue")
				}
				conn.Close(context.Background())
				conn = nil
				sleep(ctx, 100*time.Millisecond)
				continue
			}
			h.acked("sql", id, key)
			break
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// granter takes the leases of resources again and again (each grant a new
// epoch), recording every acknowledged epoch.
func granter(ctx context.Context, h *history, issuer *lease.Issuer, resources []string) {
	for i := 0; ctx.Err() == nil; i++ {
		res := resources[i%len(resources)]
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, err := issuer.Acquire(cctx, res, fmt.Sprintf("holder-%d", i), lease.MinTTL)
		cancel()
		if err != nil {
			switch {
			case ctx.Err() != nil, errors.Is(err, lease.ErrHeld):
			case errors.Is(err, lease.ErrAuthorityChanged):
				// Refused until an operator accepts the database: never
				// after a promotion of the synchronous standby.
				h.failed("authority_changed")
			default:
				h.failed("grant")
			}
		} else {
			h.granted(res, l.Epoch)
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func mapValues(m map[string]string) []string {
	var v []string
	for _, s := range m {
		v = append(v, s)
	}
	return v
}

func head(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// describe says where an intent stands: its record and its idempotency
// key's row.
func describe(ctx context.Context, pool *pgxpool.Pool, r *outbox.Record) string {
	var key string
	rows, err := pool.Query(ctx, `SELECT row_to_json(k)::text FROM fencegate.idempotency_keys k WHERE k.idempotency_key LIKE '%' || $1 || '%'`, r.IdempotencyKey)
	if err == nil {
		keys, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		key = strings.Join(keys, ", ")
	}
	b, _ := json.Marshal(r)
	return fmt.Sprintf("intent %s; key %s", b, key)
}
