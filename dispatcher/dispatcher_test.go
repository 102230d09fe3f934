package dispatcher_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/internal/testhook"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/metricstest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/testkit/toolbin"
	"github.com/fencegate/fencegate/internal/wire"
)

// checkRelayedOnce checks that the stream holds exactly one message, relay
// 1, for each of want and nothing else.
func checkRelayedOnce(t *testing.T, msgs []streamMsg, want []int64) {
	t.Helper()
	got := byIntent(msgs)
	for _, id := range want {
		relays := got[id]
		if len(relays) != 1 || relays[0] != 1 {
			t.Errorf("intent %d: relays in stream %v, want [1]", id, relays)
		}
		delete(got, id)
	}
	for id, relays := range got {
		t.Errorf("intent %d in stream (relays %v) was not committed", id, relays)
	}
	for _, m := range msgs {
		if m.msgID != wire.Namespace("").MsgID(m.intentID, m.relay) {
			t.Errorf("intent %d: Nats-Msg-Id %q, want %q", m.intentID, m.msgID, wire.Namespace("").MsgID(m.intentID, m.relay))
		}
	}
}

// The key outbox test (after watermill-sql's TestNotMissingMessages):
// transactions begin in one order and commit in another, some roll back;
// every committed intent is relayed exactly once, none is skipped, and no
// rolled-back one ever appears.
func TestOutOfOrderCommitsAndRollback(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	e.start(dispatcher.Config{Schema: testdb.Schema(), Registerer: reg})
	ctx := context.Background()

	var (
		mu         sync.Mutex
		committed  []int64
		rolledBack []int64
	)

	// Deterministic part: five transactions enqueue in id order 0..4, then
	// commit 4, 2, 0, 3; 1 rolls back. Each commit is relayed before the
	// next one, so the dispatcher has relayed a higher id while a lower one
	// was still uncommitted.
	const n = 5
	txs := make([]pgx.Tx, n)
	ids := make([]int64, n)
	for i := range n {
		res := fmt.Sprintf("ooo-%d", i)
		epoch := e.acquire(res)
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		r, err := e.ob.EnqueueTx(ctx, tx, fileIntent(res, epoch, "op", 100))
		if err != nil {
			t.Fatal(err)
		}
		txs[i], ids[i] = tx, r.IntentID
	}
	if !slices.IsSorted(ids) {
		t.Fatalf("ids not in begin order: %v", ids)
	}
	for _, i := range []int{4, 2, 0, 3} {
		if err := txs[i].Commit(ctx); err != nil {
			t.Fatal(err)
		}
		committed = append(committed, ids[i])
		waitFor(t, 10*time.Second, fmt.Sprintf("intent %d relayed", ids[i]), func() (bool, string) {
			var st string
			_ = e.pool.QueryRow(ctx, testdb.SQL(`SELECT status FROM fencegate.intents WHERE intent_id = $1`), ids[i]).Scan(&st)
			return st == "relayed", st
		})
	}
	if err := txs[1].Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	rolledBack = append(rolledBack, ids[1])

	// Concurrent part: 8 workers, each on its own resource, commit or roll
	// back short transactions that overlap at random.
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			res := fmt.Sprintf("worker-%d", w)
			epoch := e.acquire(res)
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for j := range 30 {
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				r, err := e.ob.EnqueueTx(ctx, tx, fileIntent(res, epoch, "op-"+strconv.Itoa(j), 100))
				if err != nil {
					_ = tx.Rollback(ctx)
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				if rng.IntN(5) == 0 {
					if err := tx.Rollback(ctx); err != nil {
						t.Error(err)
					}
					mu.Lock()
					rolledBack = append(rolledBack, r.IntentID)
					mu.Unlock()
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				committed = append(committed, r.IntentID)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	e.waitAllRelayed(30 * time.Second)

	msgs := readStream(t, e.js)
	checkRelayedOnce(t, msgs, committed)
	for _, id := range rolledBack {
		if slices.ContainsFunc(msgs, func(m streamMsg) bool { return m.intentID == id }) {
			t.Errorf("rolled-back intent %d was relayed", id)
		}
	}
	counts := e.relayCounts()
	if len(counts) != len(committed) {
		t.Errorf("%d intents in the database, %d committed", len(counts), len(committed))
	}
	for _, id := range committed {
		if counts[id] != 1 {
			t.Errorf("intent %d: relay_count %d, want 1", id, counts[id])
		}
	}

	// The headers of one message carry the intent's identity.
	var m streamMsg
	for _, x := range msgs {
		if x.intentID == ids[0] {
			m = x
		}
	}
	h := m.header
	if h.Get(wire.HeaderResource) != "ooo-0" || h.Get(wire.HeaderEpoch) != "1" || h.Get(wire.HeaderKind) != "file" ||
		h.Get(wire.HeaderFence) != "execute" || h.Get(wire.HeaderIdempotencyKey) != "ooo-0/op" || h.Get(wire.HeaderRelay) != "1" ||
		m.subject != wire.Namespace("").Subject("file") {
		t.Errorf("message of intent %d: subject %q headers %v", ids[0], m.subject, h)
	}
	if got := metricValue(t, reg, "fencegate_dispatcher_published_total"); int(got) != len(committed) {
		t.Errorf("published_total = %v, want %d", got, len(committed))
	}
}

// metricValue returns a counter's or gauge's value from reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return metricstest.Value(metricstest.Get(t, reg, name, nil))
}

// claimLog records every claim of every dispatcher.
type claimLog struct {
	mu     sync.Mutex
	claims map[int64][]string // intent id → "dispatcher/relay" per claim
	per    map[string]int
}

func newClaimLog() *claimLog {
	return &claimLog{claims: map[int64][]string{}, per: map[string]int{}}
}

func (l *claimLog) hook(id string, cs []testhook.Claim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cs {
		l.claims[c.IntentID] = append(l.claims[c.IntentID], fmt.Sprintf("%s/%d", id, c.Relay))
	}
	l.per[id] += len(cs)
}

// Two dispatchers on one database: every intent is relayed, and no intent
// is ever claimed by both. With claims that never expire during the test and
// no publish failures, each intent is claimed exactly once in all: a second
// claim at the same relay count would mean two dispatchers held it at once
// (relay_count only moves when the holder marks it relayed).
func TestTwoDispatchers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	log := newClaimLog()
	cfg := dispatcher.Config{Schema: testdb.Schema(), BatchSize: 20, MaxInFlight: 100}
	hooks := testhook.WithDispatcher(context.Background(), testhook.Dispatcher{Claimed: log.hook})
	ids := e.backlog(1500, 200)
	cfg.ID = "d1"
	e.startContext(hooks, cfg)
	cfg.ID = "d2"
	e.startContext(hooks, cfg)
	// More intents keep committing through the fenced path meanwhile.
	epoch := e.acquire("two")
	for j := range 200 {
		r, err := e.ob.Enqueue(context.Background(), fileIntent("two", epoch, "op-"+strconv.Itoa(j), 100))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.IntentID)
	}
	e.waitAllRelayed(60 * time.Second)

	log.mu.Lock()
	defer log.mu.Unlock()
	for _, id := range ids {
		if c := log.claims[id]; len(c) != 1 {
			t.Errorf("intent %d claimed %d times: %v", id, len(c), c)
		}
	}
	if log.per["d1"] == 0 || log.per["d2"] == 0 {
		t.Errorf("claims per dispatcher %v: want both to have worked", log.per)
	}
	t.Logf("claims per dispatcher: %v", log.per)
	checkRelayedOnce(t, readStream(t, e.js), ids)
}

// A message deleted from the stream after its PubAck is not a lost intent:
// PostgreSQL still says `relayed` with no outcome, so after the relay
// timeout the intent is published again under a new message id.
func TestRerelayAfterMessageLost(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	e.start(dispatcher.Config{Schema: testdb.Schema(), RelayTimeout: time.Second, PollInterval: 100 * time.Millisecond, Registerer: reg})
	epoch := e.acquire("lost")
	r, err := e.ob.Enqueue(context.Background(), fileIntent("lost", epoch, "op", 100))
	if err != nil {
		t.Fatal(err)
	}
	var first streamMsg
	waitFor(t, 10*time.Second, "first relay in the stream", func() (bool, string) {
		for _, m := range readStream(t, e.js) {
			if m.intentID == r.IntentID && m.relay == 1 {
				first = m
				return true, ""
			}
		}
		return false, "not yet"
	})
	ctx := context.Background()
	s, err := e.js.Stream(ctx, wire.Namespace("").Stream())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, first.seq); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "re-relay with relay 2", func() (bool, string) {
		for _, m := range readStream(t, e.js) {
			if m.intentID == r.IntentID && m.relay == 2 {
				if m.msgID != wire.Namespace("").MsgID(r.IntentID, 2) {
					t.Fatalf("re-relay msg id %q", m.msgID)
				}
				return true, ""
			}
		}
		return false, "not yet"
	})
	waitFor(t, 5*time.Second, "relay_count 2 recorded", func() (bool, string) {
		n := e.relayCounts()[r.IntentID]
		return n >= 2, strconv.Itoa(n)
	})
	if got := metricValue(t, reg, "fencegate_dispatcher_rerelayed_total"); got < 1 {
		t.Errorf("rerelayed_total = %v, want ≥ 1", got)
	}
	// Commit to PubAck is timed for the first relay only: a re-relay's
	// age (at least RelayTimeout by construction; an operator's retry's,
	// hours) would page the relay-lag alert on a relay that keeps up.
	lat := metricstest.Get(t, reg, "fencegate_dispatcher_relay_latency_seconds", nil).GetHistogram()
	if n := lat.GetSampleCount(); n != 1 {
		t.Errorf("relay_latency_seconds counted %d publishes, want 1 (the first relay, not the re-relay)", n)
	}
}

// A NATS server process killed and restarted while intents keep being
// committed: everything committed meanwhile arrives once it is back.
func TestNATSRestartWhileCommitting(t *testing.T) {
	t.Parallel()
	p := natstest.StartProcess(t)
	e := setupWith(t, p.URL)
	e.start(dispatcher.Config{Schema: testdb.Schema(), PollInterval: 100 * time.Millisecond, PublishTimeout: time.Second, ClaimTTL: 5 * time.Second},
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))

	epoch := e.acquire("restart")
	var (
		mu   sync.Mutex
		ids  []int64
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(ids) }
	wg.Go(func() {
		for j := 0; !stop.Load(); j++ {
			r, err := e.ob.Enqueue(context.Background(), fileIntent("restart", epoch, "op-"+strconv.Itoa(j), 100))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			ids = append(ids, r.IntentID)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	})
	defer func() { stop.Store(true); wg.Wait() }()

	waitFor(t, 10*time.Second, "some intents relayed", func() (bool, string) {
		by, _ := e.counts()
		return by["relayed"] >= 50, fmt.Sprint(by)
	})
	p.Kill()
	before := count()
	waitFor(t, 10*time.Second, "intents committed while NATS is down", func() (bool, string) {
		return count() >= before+200, strconv.Itoa(count() - before)
	})
	p.Restart()
	before = count()
	waitFor(t, 10*time.Second, "intents committed after NATS is back", func() (bool, string) {
		return count() >= before+100, strconv.Itoa(count() - before)
	})
	stop.Store(true)
	wg.Wait()
	e.waitAllRelayed(60 * time.Second)

	nc := natstest.Connect(t, p.URL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	got := byIntent(readStream(t, js))
	for _, id := range ids {
		if len(got[id]) == 0 {
			t.Errorf("intent %d committed and marked relayed but not in the stream", id)
		}
	}
	t.Logf("%d intents committed across the restart", len(ids))
}

// Publishes that fail are not marked relayed: their claims are returned and
// they are published once the stream is back. Here the stream is deleted
// under the running dispatcher, which sets it up again after the failure.
func TestPublishFailureReturnsClaims(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	e.start(dispatcher.Config{Schema: testdb.Schema(), PollInterval: 50 * time.Millisecond, PublishTimeout: time.Second, ClaimTTL: 5 * time.Second, Registerer: reg})
	ctx := context.Background()
	epoch := e.acquire("fail")
	if _, err := e.ob.Enqueue(ctx, fileIntent("fail", epoch, "first", 100)); err != nil {
		t.Fatal(err)
	}
	e.waitAllRelayed(10 * time.Second)
	if err := e.js.DeleteStream(ctx, wire.Namespace("").Stream()); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for j := range 20 {
		r, err := e.ob.Enqueue(ctx, fileIntent("fail", epoch, "op-"+strconv.Itoa(j), 100))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.IntentID)
	}
	e.waitAllRelayed(30 * time.Second)
	got := byIntent(readStream(t, e.js))
	for _, id := range ids {
		if len(got[id]) != 1 {
			t.Errorf("intent %d: relays in the recreated stream %v, want one", id, got[id])
		}
	}
	if n := metricValue(t, reg, "fencegate_dispatcher_publish_errors_total"); n < 1 {
		t.Errorf("publish_errors_total = %v, want ≥ 1", n)
	}
}

// DuplicateWindow must be longer than ClaimTTL (its doc said to keep it so;
// Validate accepted 1s against the 30s default): refused naming
// DuplicateWindow. The defaults, and either default with the other set
// within bounds, are valid.
func TestDuplicateWindowLongerThanClaimTTL(t *testing.T) {
	t.Parallel()
	coretest.Refused(t, map[string]func() error{
		"DuplicateWindow": dispatcher.Config{DuplicateWindow: time.Second}.Validate,
	})
	coretest.Refused(t, map[string]func() error{
		"DuplicateWindow": dispatcher.Config{ClaimTTL: time.Minute, DuplicateWindow: time.Minute}.Validate,
	})
	coretest.Refused(t, map[string]func() error{
		"DuplicateWindow": dispatcher.Config{ClaimTTL: 5 * time.Minute}.Validate,
	})
	for _, c := range []dispatcher.Config{
		{},
		{ClaimTTL: 15 * time.Second},
		{DuplicateWindow: 31 * time.Second},
		{ClaimTTL: 5 * time.Minute, DuplicateWindow: 10 * time.Minute},
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// A missing pool or NATS connection is bad input naming the argument, like
// a bad Config field.
func TestNewRequiresPoolAndConn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	coretest.Refused(t, map[string]func() error{
		"pool": func() error { _, err := dispatcher.New(nil, e.nc, dispatcher.Config{}); return err },
		"nc":   func() error { _, err := dispatcher.New(e.pool, nil, dispatcher.Config{}); return err },
	})
}

// A NATS server that takes publishes but acknowledges none (here a paused
// process; a stream without a leader, a user without publish permission)
// is said once: one WARN when the relay starts failing (a failed publish
// or claim, whichever comes first; DEBUG after it), and one INFO that
// relaying works again once a publish has been acknowledged after it. The
// relay said it worked again at every claim that succeeded while the
// publishes still timed out, and warned again after it, for as long as
// the outage lasted.
func TestNATSOutageIsLoggedOnce(t *testing.T) {
	t.Parallel()
	p := natstest.StartProcess(t)
	e := setupWith(t, p.URL)
	var logs toolbin.SyncBuffer
	e.start(dispatcher.Config{Schema: testdb.Schema(), PollInterval: 100 * time.Millisecond, PublishTimeout: 500 * time.Millisecond,
		ClaimTTL: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))},
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))
	epoch := e.acquire("nats-away")
	ctx := context.Background()
	enqueue := func(op string) {
		if _, err := e.ob.Enqueue(ctx, fileIntent("nats-away", epoch, op, 100)); err != nil {
			t.Fatal(err)
		}
	}
	enqueue("before")
	e.waitAllRelayed(10 * time.Second)
	p.Pause()
	// Intents keep coming while NATS is away, so that every claim finds
	// some to publish.
	for i := range 30 {
		enqueue("during-" + strconv.Itoa(i))
		time.Sleep(100 * time.Millisecond)
	}
	p.Resume()
	enqueue("after")
	e.waitAllRelayed(60 * time.Second)
	waitFor(t, 20*time.Second, "the relay says it works again", func() (bool, string) {
		return strings.Contains(logs.String(), `level=INFO msg="dispatcher: relaying works again"`), logs.String()
	})
	log := logs.String()
	warned := strings.Count(log, `level=WARN msg="dispatcher: `)
	again := strings.Count(log, `msg="dispatcher: relaying works again"`)
	t.Logf("3 s of NATS taking no publishes: %d WARN lines, %d that relaying works again", warned, again)
	if warned != 1 || again != 1 {
		t.Errorf("%d WARN lines and %d that relaying works again in one outage; want 1 and 1:\n%s", warned, again, log)
	}
}
