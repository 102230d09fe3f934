package lease_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencegate/fencegate/internal/testdb"
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
			iss := lease.NewIssuer(pool)
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
