// Package chaos runs the randomized fault run (internal/chaos) as a test:
// a short fixed-seed run under `go test ./...`, any seed and duration with
//
//	make chaos SEED=42 DURATION=10m
package chaos

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/chaos"
	"github.com/fencegate/fencegate/internal/failpoint"
	ft "github.com/fencegate/fencegate/internal/faulttest"
	"github.com/fencegate/fencegate/internal/natstest"
	"github.com/fencegate/fencegate/internal/pgtest"
	"github.com/fencegate/fencegate/internal/smtptest"
)

var (
	seedFlag     = flag.Uint64("chaos.seed", 1, "seed of the fault schedule and the workers (0: random)")
	durationFlag = flag.Duration("chaos.duration", 60*time.Second, "how long faults are injected")
)

func TestMain(m *testing.M) {
	code := m.Run()
	natstest.Cleanup()
	ft.Cleanup()
	os.Exit(code)
}

// fault is one scheduled nemesis action.
type fault struct {
	at     time.Duration
	kind   string
	target int
	arg    string
}

const (
	nWorkers  = 3
	nGateways = 2
	workerTTL = 400 * time.Millisecond
)

var crashPoints = []string{failpoint.AfterEffectBeforeRecord, failpoint.AfterRenameBeforeRecord, failpoint.AfterPublishBeforeMark}

// schedule derives the whole fault schedule from the seed: the same seed
// replays the same faults at the same offsets.
func schedule(seed uint64, d time.Duration) []fault {
	rng := rand.New(rand.NewPCG(seed, 0xfa17))
	var out []fault
	at := time.Second
	for {
		at += time.Duration(500+rng.IntN(2500)) * time.Millisecond
		if at >= d {
			return out
		}
		f := fault{at: at}
		switch p := rng.IntN(100); {
		case p < 35:
			f.kind, f.target = "pause_worker", rng.IntN(nWorkers)
			f.arg = (workerTTL*2 + time.Duration(rng.IntN(800))*time.Millisecond).String()
		case p < 60:
			f.kind, f.target = "kill9_gateway", rng.IntN(nGateways)
		case p < 72:
			f.kind, f.target = "crash_gateway_at_failpoint", rng.IntN(nGateways)
			f.arg = crashPoints[rng.IntN(len(crashPoints))]
		case p < 86:
			f.kind = "restart_nats"
		case p < 93:
			f.kind = "restart_postgres"
		default:
			f.kind = "kill9_postgres"
		}
		out = append(out, f)
	}
}

func TestChaos(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = rand.Uint64() % 1_000_000
	}
	dur := *durationFlag
	t.Logf("chaos: seed %d, duration %s (replay: make chaos SEED=%d DURATION=%s)", seed, dur, seed, dur)
	ctx := context.Background()

	bin := ft.Gateway(t)
	dir := t.TempDir()
	workerBin := filepath.Join(dir, "worker")
	if err := ft.GoBuild(workerBin, "./internal/chaos/worker", ""); err != nil {
		t.Fatal(err)
	}
	cl, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = cl.Stop() })
	db := cl.URL("postgres")
	ft.Expect(t, ft.Gw(t, bin, db, nil, "migrate"), 0, "")
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := chaos.InstallLogs(ctx, pool); err != nil {
		t.Fatal(err)
	}
	ns := natstest.StartProcess(t)
	mp := smtptest.StartMailpit(t)
	root := filepath.Join(dir, "files")
	const domain = "chaos.fencegate.test"
	runArgs := []string{"run", "--nats-url", ns.URL, "--adapters", "email,file", "--file-root", root,
		"--smtp-addr", mp.SMTPAddr, "--mail-lookup", "mailpit", "--mailpit-url", mp.BaseURL, "--mail-domain", domain,
		"--poll-interval", "200ms", "--relay-timeout", "3s", "--claim-ttl", "5s", "--publish-timeout", "3s", "--log-level", "warn",
		"--execute-timeout", "4s", "--idempotency-lock-timeout", "10s"}
	gateways := make([]*ft.Proc, nGateways)
	startGateway := func(i int, fp string) {
		var env []string
		if fp != "" {
			env = []string{failpoint.EnvVar + "=" + fp}
		}
		gateways[i] = ft.Start(t, bin, db, env, runArgs...)
	}
	for i := range gateways {
		startGateway(i, "")
	}

	resources := "res-0,res-1,res-2"
	workers := make([]*ft.Proc, nWorkers)
	var histories []string
	for i := range workers {
		out := filepath.Join(dir, fmt.Sprintf("w%d.jsonl", i))
		histories = append(histories, out)
		workers[i] = ft.Start(t, workerBin, db, nil, "-id", fmt.Sprintf("w%d", i), "-seed", strconv.FormatUint(seed*100+uint64(i), 10),
			"-resources", resources, "-ttl", workerTTL.String(), "-out", out)
	}

	// The nemesis. Offsets count from here, after the set-up.
	start := time.Now()
	counts := map[string]int{}
	sched := schedule(seed, dur)
	for _, f := range sched {
		if wait := time.Until(start.Add(f.at)); wait > 0 {
			time.Sleep(wait) // the schedule's offset: the faults' timing
		}
		counts[f.kind]++
		t.Logf("chaos: %6.1fs %s %d %s", time.Since(start).Seconds(), f.kind, f.target, f.arg)
		switch f.kind {
		case "pause_worker":
			w := workers[f.target]
			w.Signal(syscall.SIGSTOP)
			d, _ := time.ParseDuration(f.arg)
			time.AfterFunc(d, func() { w.Signal(syscall.SIGCONT) })
		case "kill9_gateway":
			gateways[f.target].Kill()
			startGateway(f.target, "")
		case "crash_gateway_at_failpoint":
			gateways[f.target].Kill()
			startGateway(f.target, f.arg+"=1*crash")
		case "restart_nats":
			ns.Kill()
			ns.Restart()
		case "restart_postgres":
			if err := cl.Restart(ctx); err != nil {
				t.Fatal(err)
			}
		case "kill9_postgres":
			if err := cl.Kill(); err != nil {
				t.Fatal(err)
			}
			// The postmaster's backends die a moment after it: start
			// again until the data directory is free.
			ft.Poll(t, time.Minute, "PostgreSQL to start after kill -9", func() (bool, string) {
				err := cl.StartAgain(ctx)
				return err == nil, fmt.Sprint(err)
			})
		}
		// A gateway that crashed at its failpoint is restarted plain.
		for i, g := range gateways {
			if g.Exited() {
				counts["failpoint_crashes"]++
				startGateway(i, "")
			}
		}
	}
	if wait := time.Until(start.Add(dur)); wait > 0 {
		time.Sleep(wait)
	}

	// Faults stop: workers continue and finish.
	for _, w := range workers {
		w.Signal(syscall.SIGCONT)
		w.Signal(syscall.SIGTERM)
	}
	for _, w := range workers {
		if r, err := w.Wait(time.Minute); err != nil || r.Code != 0 {
			t.Fatalf("worker: %v exit %d %s", err, r.Code, r.Stderr)
		}
	}
	// Drain. Every gateway is killed, so no attempt is in flight; the
	// idempotency locks of attempts abandoned by killed processes are then
	// expired at once, standing in for their 10 s lock timeout; fresh
	// gateways recover them by lookup.
	for _, g := range gateways {
		g.Kill()
	}
	if _, err := pool.Exec(ctx, `UPDATE idempotency_keys SET locked_until = now() - interval '1 second' WHERE state = 'started'`); err != nil {
		t.Fatal(err)
	}
	for i := range gateways {
		startGateway(i, "")
	}
	ft.Poll(t, 3*time.Minute, "the outbox to drain", func() (bool, string) {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM intents WHERE status IN ('pending', 'relayed')`).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == 0, fmt.Sprintf("%d intents pending or relayed", n)
	})

	ops, err := chaos.ReadHistory(histories)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := chaos.Check(ctx, chaos.Env{Pool: pool, MailpitURL: mp.BaseURL, MailDomain: domain, FileRoot: root}, ops)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chaos: seed %d, duration %s, %d faults scheduled\n", seed, dur, len(sched))
	fmt.Fprintf(&b, "faults: %s\n", fmtCounts(counts))
	fmt.Fprintf(&b, "checked: %s\n", fmtCounts(rep.Stats))
	fmt.Fprintf(&b, "violations: %d\n", len(rep.Violations))
	for i, v := range rep.Violations {
		fmt.Fprintf(&b, "  - %s\n", v)
		if rep.Evidence[i] != "" {
			fmt.Fprintf(&b, "    history:\n      %s\n", strings.ReplaceAll(rep.Evidence[i], "\n", "\n      "))
		}
	}
	t.Log(b.String())
	if len(rep.Violations) > 0 {
		t.Fatalf("chaos: %d violations with seed %d", len(rep.Violations), seed)
	}
	t.Logf("chaos: done in %s", time.Since(start).Round(time.Second))
}

func fmtCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}
