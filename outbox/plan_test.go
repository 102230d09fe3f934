package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// An enqueue — new, or the retry of one already committed — reaches the
// intents by an index, however much the table has grown since it was last
// analyzed. A session caches the plans of fencegate_enqueue's statements;
// made while the table was young (a new install, the benchmark's fresh
// database: autovacuum analyzes at most once a minute), the look-up of an
// operation id was a sequential scan, and every later enqueue of the
// session scanned the whole table until the next ANALYZE. Counted with
// pg_stat_user_tables.seq_scan. Fails on e4f3c42 (one sequential scan per
// enqueue).
func TestEnqueueProbesOnYoungStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newYoungEnv(t)
	ob, exec := e.ob, e.exec
	// A young table, analyzed: a page of intents.
	exec(`ALTER TABLE fencegate.intents SET (autovacuum_enabled = false)`)
	exec(`INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
		SELECT 'r-' || g, 1, 'op-' || g, 'email', 'k-' || g, 'execute', '{}' FROM generate_series(1, 20) g`)
	exec(`ANALYZE fencegate.intents`)
	enqueue := func(op string, retry bool) {
		t.Helper()
		r, err := ob.Enqueue(ctx, emailIntent("young", e.epoch, op))
		if err != nil {
			t.Fatal(err)
		}
		if r.Duplicate != retry {
			t.Fatalf("enqueue %s: duplicate %v, want %v", op, r.Duplicate, retry)
		}
	}
	// The session's plans: made now, and kept (a plan is generic after
	// five runs).
	for i := range 10 {
		enqueue(fmt.Sprintf("warm-%d", i), false)
		enqueue(fmt.Sprintf("warm-%d", i), true)
	}
	// Then the table grows, not analyzed.
	exec(`INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
		SELECT 'r-' || g, 1, 'op-' || g, 'email', 'k-' || g, 'execute', '{}' FROM generate_series(21, 20020) g`)

	before := e.reads("intents")
	const n = 20
	for i := range n {
		enqueue(fmt.Sprintf("grown-%d", i), false)
		enqueue(fmt.Sprintf("grown-%d", i), true)
		enqueue(fmt.Sprintf("warm-%d", i%10), true)
	}
	after := e.reads("intents")
	e.sawInserts(before, after, n)
	if got := after.seqScans - before.seqScans; got != 0 {
		t.Errorf("%d enqueues (%d new, %d retries) scanned the grown intents table sequentially %d times; want none", 3*n, n, 2*n, got)
	} else {
		t.Logf("%d enqueues (%d new, %d retries) on a table grown 1,000× past its statistics: no sequential scan of the intents", 3*n, n, 2*n)
	}
}

// A batch enqueue reads the resources it locks and the operation ids it
// looks up, each by a probe of an index, however much the tables have
// grown since they were last analyzed. fencegate_enqueue_batch's plans
// are generic (made once per session); made on young tables, the control
// rows were locked through a join with the whole resources table and the
// operation ids looked up through a join with the whole intents table, so
// every later batch of the session read both tables in full. Counted with
// pg_stat_user_tables (rows read by sequential and index scans). Fails on
// e4f3c42 (20,000 of each table read per batch).
func TestEnqueueBatchProbesOnYoungStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newYoungEnv(t)
	ob, exec := e.ob, e.exec
	const grown = 20000
	for _, tb := range []string{"intents", "resources"} {
		exec(`ALTER TABLE fencegate.` + tb + ` SET (autovacuum_enabled = false)`)
	}
	exec(`INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
		SELECT 'r-' || g, 1, 'op-' || g, 'email', 'k-' || g, 'execute', '{}' FROM generate_series(1, 20) g`)
	exec(`INSERT INTO fencegate.resources (resource_id, epoch) SELECT 'res-' || g, 1 FROM generate_series(1, 5) g`)
	exec(`ANALYZE fencegate.intents`)
	exec(`ANALYZE fencegate.resources`)
	const size = 10
	batch := func(tag string, retry bool) {
		t.Helper()
		in := make([]outbox.Intent, size)
		for i := range in {
			in[i] = emailIntent("young", e.epoch, fmt.Sprintf("%s-%d", tag, i))
		}
		res, err := ob.EnqueueBatch(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil || r.Duplicate != retry {
				t.Fatalf("batch %s: %+v, want duplicate %v", tag, r, retry)
			}
		}
	}
	for i := range 10 { // the session's plans: made now, and kept
		batch(fmt.Sprintf("warm%d", i), false)
	}
	exec(fmt.Sprintf(`INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
		SELECT 'r-' || g, 1, 'op-' || g, 'email', 'k-' || g, 'execute', '{}' FROM generate_series(21, %d) g`, grown))
	exec(fmt.Sprintf(`INSERT INTO fencegate.resources (resource_id, epoch) SELECT 'res-' || g, 1 FROM generate_series(6, %d) g`, grown))

	i0, r0 := e.reads("intents"), e.reads("resources")
	const n = 10
	for i := range n {
		batch(fmt.Sprintf("grown%d", i), false)
		batch(fmt.Sprintf("warm%d", i), true)
	}
	i1, r1 := e.reads("intents"), e.reads("resources")
	e.sawInserts(i0, i1, n*size)
	perIntents, perResources := float64(i1.read-i0.read)/(2*n), float64(r1.read-r0.read)/(2*n)
	// One resource a batch: its control row. The intents read are the
	// probes' — each through the unique index, or, planned on young
	// statistics, through the resource's index (then at most the
	// resource's own intents) — never the table's 20,000.
	own := countIntents(t, e.admin, "resource_id = 'young'")
	if perResources != 1 || perIntents > float64(size*own) {
		t.Errorf("a batch of %d intents of one resource read %.0f resources (want 1) and %.0f intents (want at most %d probes of the resource's %d) from tables grown 1,000× past their statistics (%d rows)", size, perResources, perIntents, size, own, grown)
	} else {
		t.Logf("%d batches of %d on tables grown 1,000× past their statistics (%d rows): %.1f resources and %.0f intents read a batch (the resource holds %d)", 2*n, size, grown, perResources, perIntents, own)
	}
}

// youngEnv is a session of its own (a pool of one connection, so every
// call runs with the plans that session made) over a new database, with
// a lease on the resource "young", and a second session to set the tables
// up and read their statistics.
type youngEnv struct {
	t     *testing.T
	admin *pgxpool.Pool
	pool  *pgxpool.Pool
	ob    *outbox.Client
	epoch int64
}

func newYoungEnv(t *testing.T) *youngEnv {
	t.Helper()
	ctx := context.Background()
	url := testdb.NewURL(t)
	// Each pool is one session: reads forces out the pending statistics
	// of both, and a second connection of the admin's would keep its own.
	onePool := func() *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	admin, pool := onePool(), onePool()
	ob, err := outbox.New(pool, outbox.Config{Schema: testdb.Schema(), DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	l, err := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema())).Acquire(ctx, "young", "w", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &youngEnv{t: t, admin: admin, pool: pool, ob: ob, epoch: l.Epoch}
}

func (e *youngEnv) exec(q string) {
	e.t.Helper()
	if _, err := e.admin.Exec(context.Background(), testdb.SQL(q)); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
}

// tableStats is what the statistics count of a table so far.
type tableStats struct {
	seqScans int64 // sequential scans
	read     int64 // rows read by sequential and index scans
	inserted int64 // rows inserted
}

// reads returns what the statistics count of table so far, the session's
// own work included.
func (e *youngEnv) reads(table string) tableStats {
	e.t.Helper()
	ctx := context.Background()
	// Both sessions' counters reach the shared statistics now, each when
	// it next goes idle after pg_stat_force_next_flush. Left to itself a
	// session flushes at most once a second, and what it could not flush
	// waits for its idle timer (10 s): the admin's inserts that grow the
	// table — done just before the first reading — then landed between
	// two readings, counted as the session's (a CI run saw 20,040 inserts
	// for 20).
	for _, p := range []*pgxpool.Pool{e.pool, e.admin} {
		if _, err := p.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			e.t.Fatal(err)
		}
		if _, err := p.Exec(ctx, `SELECT 1`); err != nil {
			e.t.Fatal(err)
		}
	}
	var st tableStats
	if err := e.admin.QueryRow(ctx, `SELECT seq_scan, seq_tup_read + coalesce(idx_tup_fetch, 0), n_tup_ins
		FROM pg_stat_user_tables WHERE relid = $1::regclass`, testdb.SQL("fencegate."+table)).Scan(&st.seqScans, &st.read, &st.inserted); err != nil {
		e.t.Fatal(err)
	}
	return st
}

// sawInserts fails the test unless the statistics counted want intents
// inserted between before and after: a check of what they count is blind
// when they did not see the session's work at all.
func (e *youngEnv) sawInserts(before, after tableStats, want int64) {
	e.t.Helper()
	if got := after.inserted - before.inserted; got != want {
		e.t.Fatalf("the statistics counted %d intents inserted by the session, want %d: they did not see its work, and the check proves nothing", got, want)
	}
}
