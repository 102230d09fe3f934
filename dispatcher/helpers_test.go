package dispatcher_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/internal/testkit/coretest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

func TestMain(m *testing.M) {
	code := testdb.Run(m)
	natstest.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// env is what a dispatcher test needs: a migrated database, a JetStream
// server and clients on both.
type env struct {
	t    testing.TB
	pool *pgxpool.Pool
	url  string
	nc   *nats.Conn
	js   jetstream.JetStream
	ob   *outbox.Client
	ls   *lease.Issuer
}

// setup gives the test its own database and embedded JetStream server.
func setup(t testing.TB) *env {
	t.Helper()
	srv := natstest.Start(t)
	return setupWith(t, srv.URL)
}

func setupWith(t testing.TB, natsURL string) *env {
	t.Helper()
	pool := testdb.New(t)
	nc := natstest.Connect(t, natsURL)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ob := coretest.Outbox(t, pool)
	return &env{t: t, pool: pool, url: natsURL, nc: nc, js: js, ob: ob, ls: coretest.Issuer(pool)}
}

// start starts a dispatcher over a connection of its own, stopped at the
// test's end.
func (e *env) start(cfg dispatcher.Config, opts ...nats.Option) *dispatcher.Dispatcher {
	e.t.Helper()
	return e.startContext(context.Background(), cfg, opts...)
}

// startContext is start with the dispatcher started with ctx (which may
// carry internal/testhook's hooks).
func (e *env) startContext(ctx context.Context, cfg dispatcher.Config, opts ...nats.Option) *dispatcher.Dispatcher {
	e.t.Helper()
	nc := natstest.Connect(e.t, e.url, opts...)
	d, err := dispatcher.New(e.pool, nc, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(d.Stop)
	return d
}

// acquire takes a lease on resource and returns its epoch.
func (e *env) acquire(resource string) int64 {
	e.t.Helper()
	l, err := e.ls.Acquire(context.Background(), resource, "test", time.Hour)
	if err != nil {
		e.t.Fatalf("acquire %s: %v", resource, err)
	}
	return l.Epoch
}

// fileIntent returns a valid file intent of about size payload bytes.
func fileIntent(resource string, epoch int64, op string, size int) outbox.Intent {
	pad := strings.Repeat("x", max(size-60, 1))
	return outbox.Intent{
		Resource: resource, Epoch: epoch, OperationID: op, Kind: "file",
		Payload: []byte(`{"target":"out/` + op + `.txt","content":"` + pad + `"}`),
	}
}

// backlog inserts n pending intents directly (the fast way to make a large
// backlog; the fenced path is covered by the tests that use outbox) and
// returns their ids.
func (e *env) backlog(n, payloadSize int) []int64 {
	e.t.Helper()
	pad := strings.Repeat("x", max(payloadSize-40, 1))
	rows, err := e.pool.Query(context.Background(), testdb.SQL(`
		INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
		SELECT 'backlog', 1, 'op-' || g || '-' || md5(random()::text), 'file', 'key-' || g || '-' || md5(random()::text), 'execute',
		       jsonb_build_object('target', 'out/' || g, 'content', $2::text)
		FROM generate_series(1, $1) g
		RETURNING intent_id`), n, pad)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// counts returns the number of intents per status and how many are claimed.
func (e *env) counts() (byStatus map[string]int, claimed int) {
	e.t.Helper()
	byStatus = map[string]int{}
	rows, err := e.pool.Query(context.Background(), testdb.SQL(`SELECT status, count(*), count(claimed_by) FROM fencegate.intents GROUP BY status`))
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		var n, c int
		if err := rows.Scan(&s, &n, &c); err != nil {
			e.t.Fatal(err)
		}
		byStatus[s] = n
		claimed += c
	}
	return byStatus, claimed
}

// waitAllRelayed waits until no intent is pending and none is claimed.
func (e *env) waitAllRelayed(timeout time.Duration) {
	e.t.Helper()
	waitFor(e.t, timeout, "every intent relayed and unclaimed", func() (bool, string) {
		by, claimed := e.counts()
		return by["pending"] == 0 && claimed == 0, fmt.Sprintf("%v claimed=%d", by, claimed)
	})
}

// relayCounts returns relay_count per intent id.
func (e *env) relayCounts() map[int64]int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), testdb.SQL(`SELECT intent_id, relay_count FROM fencegate.intents`))
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]int{}
	for rows.Next() {
		var id int64
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			e.t.Fatal(err)
		}
		out[id] = n
	}
	return out
}

// streamMsg is one message read back from the stream.
type streamMsg struct {
	seq      uint64
	intentID int64
	relay    int
	msgID    string
	subject  string
	header   nats.Header
	stored   time.Time // when the stream stored it (the server's clock)
}

// readStream reads every message now in the stream.
func readStream(t testing.TB, js jetstream.JetStream) []streamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, wire.Namespace("").Stream())
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := int(info.State.Msgs)
	if want == 0 {
		return nil
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []streamMsg
	for len(out) < want && ctx.Err() == nil {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			h := m.Headers()
			id, err := wire.ParseIntentID(h.Get(wire.HeaderIntentID))
			if err != nil {
				t.Fatal(err)
			}
			relay, _ := strconv.Atoi(h.Get(wire.HeaderRelay))
			out = append(out, streamMsg{seq: md.Sequence.Stream, intentID: id, relay: relay,
				msgID: h.Get(jetstream.MsgIDHeader), subject: m.Subject(), header: h, stored: md.Timestamp})
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil && len(out) < want {
			continue
		}
	}
	if len(out) < want {
		t.Fatalf("read %d of %d stream messages", len(out), want)
	}
	return out
}

// byIntent groups stream messages: relay numbers seen per intent id.
func byIntent(msgs []streamMsg) map[int64][]int {
	out := map[int64][]int{}
	for _, m := range msgs {
		out[m.intentID] = append(out[m.intentID], m.relay)
	}
	return out
}
