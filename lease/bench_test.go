package lease_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
)

// BenchmarkAcquire measures a grant (Acquire: a new epoch and its history
// row, one durable transaction) from one goroutine and from 8 at once, each
// on its own resource, so what it measures is the grant's own cost and not
// waits for a control-row lock. Metric: grants/s (and ns/op per grant).
// Run it before and after a change of the grant path to compare.
func BenchmarkAcquire(b *testing.B) {
	for _, workers := range []int{1, 8} {
		b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
			pool := testdb.New(b)
			iss := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()))
			ctx := context.Background()
			// Warm every connection and resource, so the first grants do
			// not count the pool's dials or the rows' creation.
			for w := range workers {
				if _, err := iss.Acquire(ctx, "bench-"+strconv.Itoa(w), "warm", time.Minute); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			per := (b.N + workers - 1) / workers
			for w := range workers {
				wg.Go(func() {
					res := "bench-" + strconv.Itoa(w)
					for range per {
						if _, err := iss.Acquire(ctx, res, "warm", time.Minute); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(per*workers)/time.Since(start).Seconds(), "grants/s")
		})
	}
}

// BenchmarkAuthorityCheck measures what the epoch authority check
// (fencegate_epoch_authority, run by every Acquire and Advance in the
// statement that creates the control row) costs the server: the check
// called 10,000 times in one statement, less the same statement without it,
// so the round trip and the machine's noise cancel out. Metric: µs/check.
// JIT is off: the loop's estimated cost would otherwise compile it (a few
// hundred ms), which a grant's one call never does.
func BenchmarkAuthorityCheck(b *testing.B) {
	pool := testdb.New(b)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET jit = off`); err != nil {
		b.Fatal(err)
	}
	const n = 10000
	run := func(sql string) time.Duration {
		start := time.Now()
		if _, err := conn.Exec(ctx, testdb.SQL(sql)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var with, without time.Duration
	for b.Loop() {
		with += run(`SELECT count(fencegate.fencegate_epoch_authority(1000000)) FROM generate_series(1, 10000)`)
		without += run(`SELECT count(g) FROM generate_series(1, 10000) g`)
	}
	b.ReportMetric(float64((with-without).Microseconds())/float64(b.N*n), "µs/check")
}

// BenchmarkFailoverRaise measures the raise after a failover: the first
// grant on a database that is not the epoch authority on record (here: no
// record, the same path as a higher timeline) locks and raises every
// control row and writes a history row each, in its own transaction. Over
// 100,000 resources, half of them held. Metric: s per 100,000 resources
// (ns/op is one raise of all of them, the grant included); the grants,
// renewals and enqueues of those resources wait that long
// (docs/guarantees.md, "After a failover").
func BenchmarkFailoverRaise(b *testing.B) {
	const resources = 100_000
	pool := testdb.New(b)
	iss := lease.NewIssuer(pool, lease.WithSchema(testdb.Schema()))
	ctx := context.Background()
	exec := func(sql string) {
		b.Helper()
		if _, err := pool.Exec(ctx, testdb.SQL(sql)); err != nil {
			b.Fatal(err)
		}
	}
	exec(`INSERT INTO fencegate.resources (resource_id, epoch, holder, lease_expires_at, renewed_at)
		SELECT 'raise-' || g, g, CASE WHEN g % 2 = 0 THEN 'worker' END,
			CASE WHEN g % 2 = 0 THEN now() + interval '1 hour' END, CASE WHEN g % 2 = 0 THEN now() END
		FROM generate_series(1, ` + strconv.Itoa(resources) + `) g`)
	exec(`VACUUM ANALYZE fencegate.resources`)
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		exec(`DELETE FROM fencegate.epoch_authority`)
		b.StartTimer()
		start := time.Now()
		if _, err := iss.Acquire(ctx, "raise-1", "bench", time.Minute); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
	}
	var raised int
	if err := pool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.resources WHERE resource_id LIKE 'raise-%' AND epoch > 1000000`)).Scan(&raised); err != nil {
		b.Fatal(err)
	}
	if raised != resources {
		b.Fatalf("%d of %d resources raised", raised, resources)
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/100k-resources")
}
