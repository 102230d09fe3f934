// Package adaptertest is test support for adapters: an environment that runs
// intents through the real pipeline (PostgreSQL outbox, dispatcher, NATS
// JetStream, adapter runtime), and Run, the conformance suite every adapter
// passes.
//
// It is meant for tests only: every helper takes a *testing.T and fails the
// test on error. A package using it calls Main from its TestMain; each Env
// (and each NewDatabase) is a database of its own on the PostgreSQL server
// of $GATEWAY_TEST_DATABASE_URL, else on a throwaway cluster Main stops.
// Nothing of it needs fencegate's internal packages, so an adapter written
// outside this module is tested the same way (examples/custom-adapter).
package adaptertest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// DefaultResource is the fenced resource intents are enqueued for unless
// Options.Resource says otherwise.
const DefaultResource = "job"

// WaitTimeout bounds every poll of this package.
const WaitTimeout = 20 * time.Second

// Options configures an Env.
type Options struct {
	// Executors run in the env's runtime. Without any, no runtime is
	// started (start one with StartRuntime or StartProcess).
	Executors []adapters.Executor
	// Kinds are intent kinds besides outbox.DefaultKinds (email, file, webhook, s3).
	Kinds map[string]outbox.KindSpec
	// Runtime is the runtime's configuration; Executors is filled in.
	// Zero RetryBase and RetryMax are 20ms and 100ms here, so retries in
	// tests take milliseconds.
	Runtime executor.Config
	// LockTimeout is the idempotency store's (default 5 minutes).
	LockTimeout time.Duration
	// NoGroupCommit runs the idempotency store without group commit
	// (gateway run's default has it on, and so does the Env).
	NoGroupCommit bool
	// Resource is the fenced resource. Default DefaultResource.
	Resource string
	// RelayTimeout is the dispatcher's re-relay timeout. Default 20s.
	RelayTimeout time.Duration
}

// Env is a running pipeline: a fresh migrated database, an embedded
// JetStream server, a dispatcher and (with Options.Executors) a runtime.
// Everything stops when the test ends.
type Env struct {
	Pool       *pgxpool.Pool
	DBURL      string
	NATSURL    string
	NC         *nats.Conn
	Client     *outbox.Client
	Store      *idempotency.Store
	Issuer     *lease.Issuer
	Dispatcher *dispatcher.Dispatcher
	// Runtime is the runtime started with Options.Executors, or nil.
	Runtime *executor.Runtime
	// Resource is the fenced resource intents are enqueued for.
	Resource string

	opts Options

	mu    sync.Mutex
	epoch int64
}

// NewEnv starts a pipeline for the test. The resource is acquired once, so
// intents are enqueued at its first epoch until Advance.
func NewEnv(t testing.TB, o Options) *Env {
	t.Helper()
	ctx := context.Background()
	o.Resource = cmp.Or(o.Resource, DefaultResource)
	dbURL := testdb.NewURL(t)
	pool := newPool(t, dbURL)
	ns := natstest.Start(t)
	nc := natstest.Connect(t, ns.URL)
	e := &Env{Pool: pool, DBURL: dbURL, NATSURL: ns.URL, NC: nc, Issuer: lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())), Resource: o.Resource, opts: o}
	e.Client = e.newClient(t, pool)
	e.Store = e.newStore(t, pool)
	d, err := dispatcher.New(pool, nc, dispatcher.Config{
		Schema:       testdb.Schema(),
		PollInterval: 50 * time.Millisecond,
		RelayTimeout: cmp.Or(o.RelayTimeout, 20*time.Second),
	})
	if err != nil {
		t.Fatalf("adaptertest: dispatcher: %v", err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatalf("adaptertest: start dispatcher: %v", err)
	}
	t.Cleanup(d.Stop)
	e.Dispatcher = d
	l, err := e.Issuer.Acquire(ctx, o.Resource, "worker-A", time.Hour)
	if err != nil {
		t.Fatalf("adaptertest: acquire %s: %v", o.Resource, err)
	}
	e.epoch = l.Epoch
	if len(o.Executors) > 0 {
		e.Runtime = e.StartRuntime(t, o.Runtime, o.Executors...)
	}
	return e
}

func newPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("adaptertest: %v", err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("adaptertest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (e *Env) newClient(t testing.TB, pool *pgxpool.Pool) *outbox.Client {
	t.Helper()
	kinds := outbox.DefaultKinds()
	maps.Copy(kinds, e.opts.Kinds)
	c, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema(), Kinds: kinds})
	if err != nil {
		t.Fatalf("adaptertest: outbox: %v", err)
	}
	return c
}

func (e *Env) newStore(t testing.TB, pool *pgxpool.Pool) *idempotency.Store {
	t.Helper()
	s, err := idempotency.New(pool, idempotency.Config{Schema: testdb.Schema(), LockTimeout: e.opts.LockTimeout, GroupCommit: !e.opts.NoGroupCommit})
	if err != nil {
		t.Fatalf("adaptertest: idempotency store: %v", err)
	}
	return s
}

func runtimeConfig(cfg executor.Config, executors []adapters.Executor) executor.Config {
	cfg.Executors = executors
	cfg.RetryBase = cmp.Or(cfg.RetryBase, 20*time.Millisecond)
	cfg.RetryMax = cmp.Or(cfg.RetryMax, 100*time.Millisecond)
	return cfg
}

// StartRuntime starts another runtime for executors on the env's pool and
// connection, stopped when the test ends. Zero retry delays are as in
// Options.Runtime.
func (e *Env) StartRuntime(t testing.TB, cfg executor.Config, executors ...adapters.Executor) *executor.Runtime {
	t.Helper()
	return e.StartRuntimeContext(context.Background(), t, cfg, executors...)
}

// StartRuntimeContext is StartRuntime with the runtime started with a
// context carrying ctx's values (its deadline, if any, bounds the start
// too).
func (e *Env) StartRuntimeContext(ctx context.Context, t testing.TB, cfg executor.Config, executors ...adapters.Executor) *executor.Runtime {
	t.Helper()
	return startRuntime(ctx, t, e.Pool, e.NC, e.Store, e.Client, runtimeConfig(cfg, executors))
}

// startRuntime starts a runtime with a context carrying parent's values
// (the tests' hooks, internal/testhook).
func startRuntime(parent context.Context, t testing.TB, pool *pgxpool.Pool, nc *nats.Conn, store *idempotency.Store, client *outbox.Client, cfg executor.Config) *executor.Runtime {
	t.Helper()
	rt, err := executor.NewRuntime(pool, nc, store, client, cfg)
	if err != nil {
		t.Fatalf("adaptertest: runtime: %v", err)
	}
	ctx, cancel := context.WithTimeout(parent, WaitTimeout)
	defer cancel()
	if err := rt.Start(ctx); err != nil {
		t.Fatalf("adaptertest: start runtime: %v", err)
	}
	t.Cleanup(rt.Stop)
	return rt
}

// Process is a runtime with its own database pool and NATS connection, as
// in a separate gateway process, which can be made to crash.
type Process struct {
	Runtime *executor.Runtime
	Pool    *pgxpool.Pool
	NC      *nats.Conn

	crashOnce sync.Once
	crashed   chan struct{}
}

// StartProcess starts a runtime for executors on a pool and connection of
// its own. Zero retry delays are as in Options.Runtime.
func (e *Env) StartProcess(t testing.TB, cfg executor.Config, executors ...adapters.Executor) *Process {
	t.Helper()
	return e.StartProcessContext(context.Background(), t, cfg, executors...)
}

// StartProcessContext is StartProcess with the runtime started with a
// context carrying ctx's values (its deadline, if any, bounds the start
// too).
func (e *Env) StartProcessContext(ctx context.Context, t testing.TB, cfg executor.Config, executors ...adapters.Executor) *Process {
	t.Helper()
	pool := newPool(t, e.DBURL)
	nc := natstest.Connect(t, e.NATSURL)
	p := &Process{Pool: pool, NC: nc, crashed: make(chan struct{})}
	p.Runtime = startRuntime(ctx, t, pool, nc, e.newStore(t, pool), e.newClient(t, pool), runtimeConfig(cfg, executors))
	return p
}

// Crash cuts the process off from NATS and PostgreSQL, as if it died: from
// here on it records nothing and acks nothing; what it had in flight is
// redelivered to other runtimes after the consumer's AckWait. It may be
// called from the runtime's AfterEffect hook (internal/testhook; it holds
// no connection there). Idempotent.
func (p *Process) Crash() {
	p.crashOnce.Do(func() {
		p.NC.Close()
		p.Pool.Close()
		close(p.crashed)
	})
}

// Crashed is closed once Crash has run.
func (p *Process) Crashed() <-chan struct{} { return p.crashed }

// Epoch returns the epoch intents are enqueued at.
func (e *Env) Epoch() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.epoch
}

// Advance moves the resource to epoch (another worker took over, as with an
// outside lock service's fencing token); following intents are enqueued at
// it.
func (e *Env) Advance(t testing.TB, epoch int64) {
	t.Helper()
	if _, err := e.Issuer.Advance(context.Background(), e.Resource, epoch); err != nil {
		t.Fatalf("adaptertest: advance %s to %d: %v", e.Resource, epoch, err)
	}
	e.mu.Lock()
	e.epoch = epoch
	e.mu.Unlock()
}

// Intent returns an intent for the env's resource at its current epoch.
func (e *Env) Intent(kind, op, key string, payload json.RawMessage) outbox.Intent {
	return outbox.Intent{Resource: e.Resource, Epoch: e.Epoch(), OperationID: op, Kind: kind, IdempotencyKey: key, Payload: payload}
}

// Enqueue enqueues in and returns its intent id.
func (e *Env) Enqueue(t testing.TB, in outbox.Intent) int64 {
	t.Helper()
	res, err := e.Client.Enqueue(context.Background(), in)
	if err != nil {
		t.Fatalf("adaptertest: enqueue %+v: %v", in, err)
	}
	return res.IntentID
}

// EnqueueHeldBack enqueues in parked under a claim of a dispatcher that
// does not exist, so it is not relayed until Release.
func (e *Env) EnqueueHeldBack(t testing.TB, in outbox.Intent) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	res, err := e.Client.EnqueueTx(ctx, tx, in)
	if err != nil {
		t.Fatalf("adaptertest: enqueue %+v: %v", in, err)
	}
	// Parked inside the same transaction: no dispatcher can claim it first.
	if err := intents.In(testdb.PGSchema()).Park(ctx, tx, res.IntentID, "parked-by-test", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return res.IntentID
}

// Release lets the dispatcher relay an intent parked by EnqueueHeldBack.
func (e *Env) Release(t testing.TB, id int64) {
	t.Helper()
	if err := intents.In(testdb.PGSchema()).Unpark(context.Background(), e.Pool, id); err != nil {
		t.Fatalf("adaptertest: release intent %d: %v", id, err)
	}
	e.exec(t, "SELECT pg_notify('"+testdb.PGSchema().IntentsChannel()+"', '')")
}

// Rerelay makes the dispatcher relay an intent again, as after a lost
// message: back to relayed, with a relayed_at long past the relay timeout.
//
// It waits until no dispatcher holds a claim on the intent: the runtime may
// record an outcome before the dispatcher has marked the intent relayed,
// and that mark would set relayed_at to now again.
func (e *Env) Rerelay(t testing.TB, id int64) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for {
		done, err := intents.In(testdb.PGSchema()).Backdate(context.Background(), e.Pool, id, time.Hour)
		if err != nil {
			t.Fatalf("adaptertest: re-relay intent %d: %v", id, err)
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("adaptertest: intent %d still claimed by a dispatcher after %s", id, WaitTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.exec(t, "SELECT pg_notify('"+testdb.PGSchema().IntentsChannel()+"', '')")
}

func (e *Env) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := e.Pool.Exec(context.Background(), testdb.SQL(sql), args...); err != nil {
		t.Fatalf("adaptertest: %s: %v", sql, err)
	}
}

// Get returns the intent's record.
func (e *Env) Get(t testing.TB, id int64) *outbox.Record {
	t.Helper()
	rec, err := e.Client.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("adaptertest: get intent %d: %v", id, err)
	}
	return rec
}

// WaitFor polls the intent until cond holds, failing the test after
// WaitTimeout.
func (e *Env) WaitFor(t testing.TB, id int64, what string, cond func(*outbox.Record) bool) *outbox.Record {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for {
		rec := e.Get(t, id)
		if cond(rec) {
			return rec
		}
		if time.Now().After(deadline) {
			le := "<nil>"
			if rec.LastError != nil {
				le = *rec.LastError
			}
			t.Fatalf("adaptertest: intent %d not %s after %s: status %s, attempts %d, last error %s", id, what, WaitTimeout, rec.Status, rec.Attempts, le)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitTerminal polls until the intent has a final status.
func (e *Env) WaitTerminal(t testing.TB, id int64) *outbox.Record {
	t.Helper()
	return e.WaitFor(t, id, "terminal", func(r *outbox.Record) bool { return r.Status.Terminal() })
}

// WaitStatus polls until the intent is terminal and fails the test unless
// its status is want.
func (e *Env) WaitStatus(t testing.TB, id int64, want outbox.Status) *outbox.Record {
	t.Helper()
	rec := e.WaitTerminal(t, id)
	if rec.Status != want {
		le := "<nil>"
		if rec.LastError != nil {
			le = *rec.LastError
		}
		t.Fatalf("intent %d: status %s (result %s, last error %s), want %s", id, rec.Status, rec.Result, le, want)
	}
	return rec
}

// Key returns the idempotency key's state, nil if there is none.
func (e *Env) Key(t testing.TB, kind, key string) *idempotency.Key {
	t.Helper()
	k, err := e.Store.Get(context.Background(), kind, key)
	if errors.Is(err, idempotency.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("adaptertest: key %s/%s: %v", kind, key, err)
	}
	return k
}

// Republish publishes the intent's message to JetStream again, as a
// duplicate delivery the dispatcher's dedup did not catch, and waits until
// the runtime's consumer for its kind has acked it.
func (e *Env) Republish(t testing.TB, id int64, durablePrefix string) {
	t.Helper()
	rec := e.Get(t, id)
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	js, err := jetstream.New(e.NC)
	if err != nil {
		t.Fatal(err)
	}
	var ns wire.Namespace // the env's dispatcher and runtime run without one
	msg := nats.NewMsg(ns.Subject(rec.Kind))
	msg.Header.Set(wire.HeaderIntentID, strconv.FormatInt(id, 10))
	msg.Header.Set(nats.MsgIdHdr, ns.MsgID(id, 1000+int(time.Now().UnixNano()%1000000)))
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatalf("adaptertest: republish intent %d: %v", id, err)
	}
	cons, err := js.Consumer(ctx, ns.Stream(), ns.Durable(cmp.Or(durablePrefix, "fencegate-"), rec.Kind))
	if err != nil {
		t.Fatalf("adaptertest: consumer: %v", err)
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatalf("adaptertest: consumer info (waiting for the republished message %d to be acked): %v", ack.Sequence, err)
		}
		if info.AckFloor.Stream >= ack.Sequence {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("adaptertest: republished message %d not acked in %s (ack floor %d)", ack.Sequence, WaitTimeout, info.AckFloor.Stream)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Request is the adapters.Request the runtime builds for rec.
func Request(rec *outbox.Record) adapters.Request {
	return adapters.Request{IntentID: rec.IntentID, Resource: rec.Resource, Epoch: rec.Epoch, Kind: rec.Kind,
		IdempotencyKey: rec.IdempotencyKey, Fence: rec.Fence, Payload: rec.Payload, Attempt: rec.Attempts}
}
