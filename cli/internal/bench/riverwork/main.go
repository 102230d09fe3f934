// Command riverwork is River's side of gateway bench's budget: the River
// peer's work-tuned case (shared/riverpeer: River v0.51.2 with riverpgxv5,
// one queue of MaxWorkers 100, FetchCooldown 5ms, FetchPollInterval 50ms,
// a no-op worker, NoopArgs of 512 x's) split into phases that gateway bench
// drives over stdin and stdout, so that the bench can take its server-side
// snapshots (statements, row versions, WAL, PostgreSQL's CPU) around the
// work alone, as it does around fencegate's drain:
//
//  1. It migrates River into --database-url, empties river_job, inserts
//     --jobs jobs (InsertManyFast, 10,000 a batch) on a pool it then closes
//     (its backends exit, flushing their counters), and prints "ready".
//  2. On a line on stdin it opens a new pool (40 connections, as the peer),
//     starts the working client, and waits for the last job_completed
//     event (the completion is written before the event).
//  3. It prints one JSON line: jobs, seconds, jobs_per_s, its own CPU time
//     over phase 2 (getrusage, from the line on stdin to the last event)
//     and the requests its pool sent (a pgx tracer: queries, batches,
//     CopyFrom, prepares), then stops the client and exits.
//
// It is its own module (River is no dependency of fencegate): build it
// with `cd cli/internal/bench/riverwork && go build -o /tmp/riverwork .`
// and pass the binary to `gateway bench --river-peer`.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type NoopArgs struct {
	Payload string `json:"payload"`
}

func (NoopArgs) Kind() string { return "noop" }

type NoopWorker struct {
	river.WorkerDefaults[NoopArgs]
}

func (w *NoopWorker) Work(context.Context, *river.Job[NoopArgs]) error { return nil }

// requests counts what a pool sent that waited for an answer.
type requests struct{ n atomic.Int64 }

func (r *requests) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *requests) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *requests) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *requests) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *requests) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (r *requests) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *requests) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}
func (r *requests) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *requests) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

var logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

func main() {
	dbURL := flag.String("database-url", "", "PostgreSQL URL of the database River works in")
	jobs := flag.Int("jobs", 100_000, "jobs to insert and work")
	flag.Parse()
	if *dbURL == "" || *jobs < 1 {
		log.Fatal("riverwork: --database-url and --jobs >= 1 are needed")
	}
	ctx := context.Background()

	// Phase 1: the jobs, inserted on a pool closed before the work.
	pool, err := pgxpool.New(ctx, *dbURL)
	check(err)
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	check(err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	check(err)
	_, err = pool.Exec(ctx, `TRUNCATE river_job`)
	check(err)
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: logger})
	check(err)
	payload := strings.Repeat("x", 512)
	for left := *jobs; left > 0; {
		batch := make([]river.InsertManyParams, min(left, 10_000))
		for i := range batch {
			batch[i] = river.InsertManyParams{Args: NoopArgs{Payload: payload}}
		}
		_, err := inserter.InsertManyFast(ctx, batch)
		check(err)
		left -= len(batch)
	}
	pool.Close()
	fmt.Println("ready")

	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		log.Fatal("riverwork: stdin closed before the start")
	}

	// Phase 2: the work, timed and counted from here.
	cpu0, start := cpuTime(), time.Now()
	cfg, err := pgxpool.ParseConfig(*dbURL)
	check(err)
	cfg.MaxConns = 40
	reqs := &requests{}
	cfg.ConnConfig.Tracer = reqs
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	check(err)
	workers := river.NewWorkers()
	river.AddWorker(workers, &NoopWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:            logger,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100}},
		Workers:           workers,
		FetchCooldown:     5 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
	})
	check(err)
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: *jobs + 1000, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer cancel()
	check(client.Start(ctx))
	timeout := time.After(10 * time.Minute)
	for done := 0; done < *jobs; done++ {
		select {
		case <-events:
		case <-timeout:
			log.Fatalf("riverwork: only %d of %d jobs completed in 10m", done, *jobs)
		}
	}
	elapsed := time.Since(start)
	out := map[string]any{
		"jobs": *jobs, "seconds": elapsed.Seconds(), "jobs_per_s": float64(*jobs) / elapsed.Seconds(),
		"cpu_us": (cpuTime() - cpu0).Microseconds(), "requests": reqs.n.Load(),
	}
	check(json.NewEncoder(os.Stdout).Encode(out))

	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	check(client.Stop(sctx))
	pool.Close()
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func check(err error) {
	if err != nil {
		log.Fatalf("riverwork: %v", err)
	}
}
