package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// BenchmarkEnqueueNotifyModes measures what NOTIFY costs the fenced enqueue
// and what coalescing recovers: 16 goroutines, each on its own resource,
// with a listener connected as a dispatcher would be, with a NOTIFY in every
// transaction (NotifyWindow -1), coalesced (the default window), and none;
// and the default without its lock bound (LockTimeout -1).
// The modes alternate within each iteration, so drift in the machine's load
// hits all alike. Metrics: every_enq/s, coalesced_enq/s, off_enq/s,
// unbounded_enq/s and the ratios to off.
func BenchmarkEnqueueNotifyModes(b *testing.B) {
	const workers, perWorker = 16, 250
	pool := newBenchPool(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lconn, err := pgx.Connect(ctx, pool.Config().ConnString())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := lconn.Exec(ctx, "LISTEN "+testdb.PGSchema().IntentsChannel()); err != nil {
		b.Fatal(err)
	}
	var lwg sync.WaitGroup
	lwg.Go(func() {
		for {
			if _, err := lconn.WaitForNotification(ctx); err != nil {
				return
			}
		}
	})
	defer func() { cancel(); lwg.Wait(); _ = lconn.Close(context.Background()) }()
	bb := bundle{pool: pool}
	epochs := make([]int64, workers)
	for w := range workers {
		epochs[w] = benchAcquire(b, bb, "notify-"+strconv.Itoa(w))
	}
	modes := []struct {
		name string
		cfg  outbox.Config
	}{
		{"every", outbox.Config{Schema: testdb.Schema(), NotifyWindow: -1}},
		{"coalesced", outbox.Config{Schema: testdb.Schema()}},
		{"off", outbox.Config{Schema: testdb.Schema(), DisableNotify: true}},
		// The default, without the lock_timeout set for each statement
		// (LockTimeout): what the bound costs, next to coalesced.
		{"unbounded", outbox.Config{Schema: testdb.Schema(), LockTimeout: -1}},
	}
	run := func(cfg outbox.Config, tag string) time.Duration {
		ob, err := outbox.New(pool, cfg)
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		start := time.Now()
		for w := range workers {
			wg.Go(func() {
				res := "notify-" + strconv.Itoa(w)
				for j := range perWorker {
					if _, err := ob.Enqueue(ctx, emailIntent(res, epochs[w], fmt.Sprintf("%s-%d", tag, j))); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	took := make([]time.Duration, len(modes))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for m, mode := range modes {
			took[m] += run(mode.cfg, fmt.Sprintf("%s-%d", mode.name, i))
		}
	}
	b.StopTimer()
	total := float64(workers * perWorker * b.N)
	off := total / took[2].Seconds()
	for m, mode := range modes {
		rate := total / took[m].Seconds()
		b.ReportMetric(rate, mode.name+"_enq/s")
		if mode.name != "off" {
			b.ReportMetric(rate/off, mode.name+"/off")
		}
	}
	b.ReportMetric(0, "ns/op")
}

func newBenchPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	return testdb.New(b)
}

func benchAcquire(b *testing.B, bb bundle, resource string) int64 {
	b.Helper()
	l, err := lease.NewIssuer(bb.pool, lease.WithSchema(testdb.Schema())).Acquire(context.Background(), resource, "bench", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	return l.Epoch
}
