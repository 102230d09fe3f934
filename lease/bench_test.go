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
