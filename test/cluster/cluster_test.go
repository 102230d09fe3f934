package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencegate/fencegate/internal/deployment"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	ft "github.com/fencegate/fencegate/internal/testkit/faulttest"
	"github.com/fencegate/fencegate/internal/testkit/hooktest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/outbox"
)

// EnvLong selects the long form of TestClusterFaults; EnvLogs names a
// directory where the gateway processes' logs are kept.
const (
	EnvLong = "FENCEGATE_CLUSTER_LONG"
	EnvLogs = "FENCEGATE_CLUSTER_LOGS"
)

// plan is one form of the test.
type plan struct {
	form string
	// rate is the steady load, intents enqueued per second.
	rate int
	// rounds of faults; each kills the stream's leader and restarts it,
	// then pauses the node serving the most gateway processes.
	rounds int
	// down is how long a killed node stays down at least.
	down time.Duration
	// pause is how long a node stays stopped (SIGSTOP) at least: longer
	// than the cluster's election timeout (4 to 9 s, nats-server's raft),
	// so the others elect new leaders for what it led.
	pause time.Duration
	// steady is the load before the first fault, between faults and after
	// the last.
	steady time.Duration
}

func planFor() plan {
	if os.Getenv(EnvLong) != "" {
		return plan{form: "long", rate: 50, rounds: 4, down: 20 * time.Second, pause: 30 * time.Second, steady: 10 * time.Second}
	}
	return plan{form: "short", rate: 20, rounds: 1, down: 3 * time.Second, pause: 12 * time.Second, steady: 3 * time.Second}
}

const (
	resource = "cluster"
	// gatewayConn is the name every gateway process gives its NATS
	// connection (gateway.dialNATS): what /connz counts.
	gatewayConn = "fencegate-gateway"
	nGateways   = 4
	// step bounds each wait of the test: generous, for a loaded 2-core
	// machine running every package's tests at once.
	step = 2 * time.Minute
	// moveBound bounds how long the gateway processes on a paused node
	// may stay there: the node's sockets stay open, so only a client's
	// own pings can tell it hangs.
	moveBound = 30 * time.Second
	// stallBound bounds the relays' and the outcomes' stall around each
	// fault: the election (4 to 9 s, 12 s seen on a saturated machine) and
	// the few seconds the gateway takes to notice it (the relay looks at
	// the stream every 2 s, the adapters renew a pull that missed two 2-s
	// heartbeats). Outcomes stalled 30 s (relays 5 s) in 2 of about 30
	// faults while the adapters kept nats.go's 15-s pull heartbeat.
	stallBound = 25 * time.Second
)

// fault is one injected fault and what the test saw of it.
type fault struct {
	name string
	// start: the kill or the SIGSTOP; end: the restart or the SIGCONT;
	// recovered: every replica of the stream current again after it.
	start, end, recovered time.Time
	// clientsMoved: how long after the fault every gateway process was
	// on a live node again; elected: how long after it the stream had a
	// leader on another node (polled: up to a second late, as a request
	// sent while the stream has no leader goes unanswered).
	clientsMoved, elected time.Duration
}

// The production layout under faults: a 3-node JetStream cluster, the
// stream on 3 replicas (gateway run --stream-replicas 3), two relay
// processes and two adapter processes, each given all three seed URLs.
// Under a steady load of webhook intents, the stream's leader (made the
// adapters' consumer's leader too) is killed (kill -9) and restarted later,
// and the node serving the most gateway processes (made both leaders
// first) is stopped with SIGSTOP for longer than the election timeout,
// then continued. Every intent must end succeeded with its outcome
// recorded in PostgreSQL and exactly one request at the destination, an
// HTTP receiver counting deliveries per Idempotency-Key; the gateway
// processes on the stopped node must move to a live one within 30 s; and
// neither relays nor outcomes may stall longer than 25 s around a fault.
// The test reports how long they stalled.
func TestClusterFaults(t *testing.T) {
	t.Parallel()
	p := planFor()
	ctx := context.Background()
	bin := ft.Gateway(t)
	db := testdb.NewURL(t)
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	info, err := deployment.Resolve(ctx, pool, testdb.Schema())
	if err != nil {
		t.Fatal(err)
	}
	stream := info.Namespace.Stream()
	consumer := info.Namespace.Durable("fencegate-", "webhook")
	ob := coretest.Outbox(t, pool)
	ft.Expect(t, ft.Gw(t, bin, db, nil, "epoch", "advance", "--resource", resource, "--epoch", "1"), 0, "")

	rcv := hooktest.New(t)
	c := natstest.StartCluster(t, 3)
	hostport := strings.TrimPrefix(rcv.URL(), "http://")
	base := []string{"run", "--nats-url", c.URLs()}
	// The test's PostgreSQL is a throwaway one, which may run without
	// fsync.
	env := []string{"GATEWAY_ALLOW_FSYNC_OFF=true"}
	procs := map[string]*ft.Proc{}
	for _, name := range []string{"relay-1", "relay-2"} {
		procs[name] = ft.Start(t, bin, db, env, append(base, "--adapters", "", "--stream-replicas", "3")...)
	}
	for _, name := range []string{"adapter-1", "adapter-2"} {
		procs[name] = ft.Start(t, bin, db, env, append(base, "--dispatcher=false", "--adapters", "webhook", "--webhook-allow", hostport)...)
	}
	t.Cleanup(func() {
		// FENCEGATE_CLUSTER_LOGS=dir keeps every process's log, to read
		// what happened around a fault in a run that passed.
		if dir := os.Getenv(EnvLogs); dir != "" {
			for name, pr := range procs {
				if err := os.WriteFile(filepath.Join(dir, name+".log"), []byte(pr.Stderr()), 0o644); err != nil {
					t.Errorf("keep %s's log: %v", name, err)
				}
			}
		}
		if t.Failed() {
			for _, name := range slices.Sorted(maps.Keys(procs)) {
				t.Logf("%s's stderr (tail):\n%s", name, tail(procs[name].Stderr(), 3000))
			}
		}
	})

	var ld *load
	// poll waits for cond, bounded; every round it also fails the test
	// when a gateway process exited or an enqueue failed.
	poll := func(timeout time.Duration, what string, cond func() (bool, string)) {
		t.Helper()
		ft.PollRunning(t, procs, timeout, what, func() (bool, string) {
			if ld != nil {
				if err := ld.failed(); err != nil {
					t.Fatal(err)
				}
			}
			return cond()
		})
	}
	// onLive counts the gateway processes' connections on the running,
	// not paused, nodes.
	onLive := func() (int, string) {
		total := 0
		var per []string
		for _, n := range c.Nodes {
			if !n.Running() || n.Paused() {
				continue
			}
			k, err := n.Clients(gatewayConn)
			if err != nil {
				return -1, err.Error()
			}
			total += k
			per = append(per, fmt.Sprintf("%s: %d", n.Name, k))
		}
		return total, strings.Join(per, ", ")
	}
	// waitStream polls the stream's info (from its leader) until ok
	// accepts it.
	waitStream := func(what string, ok func(*jetstream.StreamInfo) bool) *jetstream.StreamInfo {
		t.Helper()
		var info *jetstream.StreamInfo
		poll(step, what, func() (bool, string) {
			i, err := c.StreamInfo(stream, time.Second)
			if err != nil {
				return false, err.Error()
			}
			info = i
			return ok(i), natstest.DescribeCluster(i)
		})
		return info
	}
	// lead makes node the leader of the adapters' consumer too, where
	// the faults hurt most: the pull requests the adapters wait on are
	// held by it, and lost with it.
	lead := func(node *natstest.Node) bool {
		if err := c.MoveConsumerLeader(stream, consumer, node, 30*time.Second); err != nil {
			t.Logf("the consumer's leader stays where it is: %v", err)
			return false
		}
		return true
	}
	allOnLive := func() (bool, string) {
		n, detail := onLive()
		return n == nGateways, fmt.Sprintf("%d of %d gateway connections on live nodes (%s)", n, nGateways, detail)
	}

	waitStream("the stream on 3 current replicas", func(i *jetstream.StreamInfo) bool {
		return i.Config.Replicas == 3 && natstest.AllCurrent(i)
	})
	poll(step, "every gateway process connected", allOnLive)

	ld = startLoad(ob, p.rate, rcv.URL())
	defer ld.halt()
	poll(step, "the first effect", func() (bool, string) { return rcv.Total() > 0, "none yet" })
	start := time.Now()
	time.Sleep(p.steady) // load before the faults: the baseline

	var faults []*fault
	for round := 1; round <= p.rounds; round++ {
		// Kill the stream's leader: its followers elect another after
		// their election timeout; gateway processes on it lose their
		// connection at once and reconnect to another seed.
		si := waitStream("all replicas current", natstest.AllCurrent)
		victim := c.Node(si.Cluster.Leader)
		consumerLed := lead(victim)
		f := &fault{name: fmt.Sprintf("round %d: kill -9 %s (stream leader; consumer leader: %t)", round, victim.Name, consumerLed), start: time.Now()}
		faults = append(faults, f)
		victim.Kill()
		poll(step, "every gateway process on a live node", allOnLive)
		f.clientsMoved = time.Since(f.start)
		waitStream("a leader other than "+victim.Name, func(i *jetstream.StreamInfo) bool {
			return i.Cluster != nil && i.Cluster.Leader != "" && i.Cluster.Leader != victim.Name
		})
		elected := time.Now()
		f.elected = elected.Sub(f.start)
		poll(step, "effects after the new leader's election", func() (bool, string) {
			return rcv.LastAfter(elected), "none since " + elected.Format(time.StampMilli)
		})
		if d := p.down - time.Since(f.start); d > 0 {
			time.Sleep(d) // the node stays down this long: the fault's length
		}
		victim.Restart()
		f.end = time.Now()
		waitStream(victim.Name+" current again", natstest.AllCurrent)
		f.recovered = time.Now()
		time.Sleep(p.steady) // load between the faults

		// Pause the node serving the most gateway processes, made the
		// stream's leader first: its sockets stay open and it answers
		// nothing, so the other two elect a leader, and the gateway
		// processes on it must find out by themselves that it hangs.
		var target *natstest.Node
		var served int
		poll(step, "the gateway connections per node", func() (bool, string) {
			var err error
			target, served, err = busiest(c)
			return err == nil, fmt.Sprint(err)
		})
		if err := c.MoveStreamLeader(stream, target, 30*time.Second); err != nil {
			t.Logf("the stream's leader stays where it is: %v", err)
		}
		consumerLed = lead(target)
		si = waitStream("all replicas current", natstest.AllCurrent)
		f = &fault{name: fmt.Sprintf("round %d: SIGSTOP %s (%d gateway processes on it; stream leader: %t, consumer leader: %t)",
			round, target.Name, served, si.Cluster.Leader == target.Name, consumerLed), start: time.Now()}
		faults = append(faults, f)
		target.Pause()
		poll(moveBound, "the gateway processes on the paused node "+target.Name+" to move to a live node", allOnLive)
		f.clientsMoved = time.Since(f.start)
		waitStream("a leader other than the paused "+target.Name, func(i *jetstream.StreamInfo) bool {
			return i.Cluster != nil && i.Cluster.Leader != "" && i.Cluster.Leader != target.Name
		})
		elected = time.Now()
		f.elected = elected.Sub(f.start)
		poll(step, "effects while "+target.Name+" is paused", func() (bool, string) {
			return rcv.LastAfter(elected), "none since " + elected.Format(time.StampMilli)
		})
		if d := p.pause - time.Since(f.start); d > 0 {
			time.Sleep(d) // the node stays stopped this long: the fault's length
		}
		target.Resume()
		f.end = time.Now()
		waitStream(target.Name+" current again", natstest.AllCurrent)
		f.recovered = time.Now()
		time.Sleep(p.steady) // load after the fault
	}
	ids := ld.halt()
	if err := ld.failed(); err != nil {
		t.Fatal(err)
	}

	// Every intent ends, and then nothing is left to deliver: no message
	// pending or awaiting its ack on any consumer, so no later delivery
	// can add an effect to the counts checked below.
	var recs map[int64]*outbox.Record
	poll(3*time.Minute, "every intent to end", func() (bool, string) {
		// The destination first (cheap): an intent ends after its request.
		if n := rcv.Keys(); n < len(ids) {
			return false, fmt.Sprintf("%d of %d keys at the destination", n, len(ids))
		}
		var err error
		if recs, err = coretest.Records(ob, ids); err != nil {
			return false, err.Error()
		}
		open := 0
		for _, r := range recs {
			if !r.Status.Terminal() {
				open++
			}
		}
		return open == 0, fmt.Sprintf("%d of %d intents not ended", open, len(ids))
	})
	poll(step, "every consumer idle", func() (bool, string) { return consumersIdle(c.URLs(), stream) })

	for _, id := range ids {
		r := recs[id]
		if r == nil {
			t.Fatalf("intent %d is gone", id)
		}
		if r.Status != outbox.StatusSucceeded || len(r.Result) == 0 || r.CompletedAt == nil {
			t.Errorf("intent %d (%s): status %s, result %s, last error %v", id, r.IdempotencyKey, r.Status, r.Result, deref(r.LastError))
		}
		if n := rcv.Count(r.IdempotencyKey); n != 1 {
			t.Errorf("intent %d (%s): %d requests at the destination, want 1", id, r.IdempotencyKey, n)
		}
	}
	if n := rcv.Keys(); n != len(ids) {
		t.Errorf("the destination saw %d keys, %d intents were enqueued", n, len(ids))
	}

	// Stalls, from the timestamps PostgreSQL recorded: the longest gap
	// between consecutive relays (relayed_at) and between consecutive
	// outcomes (completed_at) around each fault, against the steady
	// load's before the first.
	relays, outcomes := times(recs, func(r *outbox.Record) *time.Time { return r.RelayedAt }), times(recs, func(r *outbox.Record) *time.Time { return r.CompletedAt })
	baseRelay := longestGapWithin(relays, start, faults[0].start)
	baseOutcome := longestGapWithin(outcomes, start, faults[0].start)
	t.Logf("steady load (%d/s): longest gap between relays %s, between outcomes %s", p.rate, ms(baseRelay), ms(baseOutcome))
	var worstRelay, worstOutcome time.Duration
	var parts []string
	for _, f := range faults {
		rg := longestGap(relays, f.start, f.recovered)
		og := longestGap(outcomes, f.start, f.recovered)
		slowest := slowestIntent(recs, f.start, f.recovered)
		worstRelay, worstOutcome = max(worstRelay, rg), max(worstOutcome, og)
		t.Logf("%s: for %s, replicas current %s after its end; stream leader elsewhere after %s, gateway processes all on live nodes after %s; relays stalled %s, outcomes %s; slowest intent enqueued meanwhile: %s to its outcome",
			f.name, ms(f.end.Sub(f.start)), ms(f.recovered.Sub(f.end)), ms(f.elected), ms(f.clientsMoved), ms(rg), ms(og), ms(slowest))
		parts = append(parts, fmt.Sprintf("%s relay stall %s, outcome stall %s", strings.SplitN(f.name, " (", 2)[0], ms(rg), ms(og)))
		if rg > stallBound || og > stallBound {
			t.Errorf("%s: relays stalled %s and outcomes %s; want at most %s each", f.name, ms(rg), ms(og), stallBound)
		}
	}
	for name, pr := range procs {
		t.Logf("%s: %d NATS reconnects", name, strings.Count(pr.Stderr(), "gateway: NATS reconnected"))
	}
	t.Logf("summary (%s form): %d intents at %d/s, each succeeded with one effect; longest relay stall %s, outcome stall %s (steady: %s); %s",
		p.form, len(ids), p.rate, ms(worstRelay), ms(worstOutcome), ms(baseRelay), strings.Join(parts, "; "))
}

// busiest returns the node serving the most gateway processes.
func busiest(c *natstest.Cluster) (*natstest.Node, int, error) {
	var best *natstest.Node
	most := -1
	for _, n := range c.Nodes {
		k, err := n.Clients(gatewayConn)
		if err != nil {
			return nil, 0, err
		}
		if k > most {
			best, most = n, k
		}
	}
	return best, most, nil
}

// load enqueues webhook intents at a steady rate through the outbox, as a
// worker would, until halted.
type load struct {
	mu   sync.Mutex
	ids  []int64
	err  error
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func startLoad(ob *outbox.Client, rate int, dest string) *load {
	l := &load{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		// A ticker drops the ticks an enqueue slower than the interval
		// missed: the rate is at most rate, never a burst to catch up.
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-l.stop:
				return
			case <-tick.C:
			}
			key := fmt.Sprintf("key-%d", n)
			payload, _ := json.Marshal(map[string]any{
				"url":        dest + "/hook",
				"body":       map[string]int{"n": n},
				"lookup_url": dest + "/lookup/" + url.PathEscape(key),
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			res, err := ob.Enqueue(ctx, outbox.Intent{Resource: resource, Epoch: 1, OperationID: fmt.Sprintf("op-%d", n),
				Kind: "webhook", IdempotencyKey: key, Payload: payload})
			cancel()
			l.mu.Lock()
			if err != nil {
				l.err = fmt.Errorf("enqueue %s: %w", key, err)
				l.mu.Unlock()
				return
			}
			l.ids = append(l.ids, res.IntentID)
			l.mu.Unlock()
		}
	}()
	return l
}

// halt stops the load, waits for its last enqueue, and returns the ids
// enqueued.
func (l *load) halt() []int64 {
	l.once.Do(func() { close(l.stop) })
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ids)
}

func (l *load) failed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// consumersIdle reports whether every consumer of the stream has nothing
// pending and nothing awaiting an ack.
func consumersIdle(urls, stream string) (bool, string) {
	nc, err := nats.Connect(urls, nats.Timeout(2*time.Second), nats.NoReconnect())
	if err != nil {
		return false, err.Error()
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false, err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return false, err.Error()
	}
	lister := s.ListConsumers(ctx)
	var busy []string
	n := 0
	for ci := range lister.Info() {
		n++
		if ci.NumPending > 0 || ci.NumAckPending > 0 {
			busy = append(busy, fmt.Sprintf("%s: %d pending, %d awaiting ack", ci.Name, ci.NumPending, ci.NumAckPending))
		}
	}
	if err := lister.Err(); err != nil {
		return false, err.Error()
	}
	if n == 0 {
		return false, "no consumer"
	}
	return len(busy) == 0, strings.Join(busy, "; ")
}

// times returns the timestamps field picks, sorted.
func times(recs map[int64]*outbox.Record, field func(*outbox.Record) *time.Time) []time.Time {
	var out []time.Time
	for _, r := range recs {
		if ts := field(r); ts != nil {
			out = append(out, *ts)
		}
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// longestGap returns the longest gap between consecutive timestamps of ts
// (sorted) that overlaps [from, to]: the first event after from counts
// from the last one before it, so a stall that began with the fault is
// measured whole.
func longestGap(ts []time.Time, from, to time.Time) time.Duration {
	var longest time.Duration
	for i := 1; i < len(ts); i++ {
		a, b := ts[i-1], ts[i]
		if b.Before(from) || a.After(to) {
			continue
		}
		longest = max(longest, b.Sub(a))
	}
	return longest
}

// longestGapWithin returns the longest gap between consecutive timestamps
// of ts (sorted) that both lie in [from, to].
func longestGapWithin(ts []time.Time, from, to time.Time) time.Duration {
	// ts is sorted: what lies in [from, to] is one run of it, and every gap
	// of that run overlaps [from, to].
	in := slices.DeleteFunc(slices.Clone(ts), func(t time.Time) bool { return t.Before(from) || t.After(to) })
	return longestGap(in, from, to)
}

// slowestIntent returns the longest time from enqueue to outcome among the
// intents enqueued in [from, to].
func slowestIntent(recs map[int64]*outbox.Record, from, to time.Time) time.Duration {
	var slowest time.Duration
	for _, r := range recs {
		if r.CompletedAt == nil || r.CreatedAt.Before(from) || r.CreatedAt.After(to) {
			continue
		}
		slowest = max(slowest, r.CompletedAt.Sub(r.CreatedAt))
	}
	return slowest
}

func ms(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
