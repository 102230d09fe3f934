// Package chaos runs the randomized fault run (test/chaos/internal/chaos) as a test.
// Its short form (shortDuration, seed shortSeed, the minimum counts scaled
// down) runs in `go test ./...`; the long form runs with -chaos.duration:
//
//	make chaos SEED=42 DURATION=10m
package chaos

import (
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/internal/failpoint"
	ft "github.com/fencegate/fencegate/internal/testkit/faulttest"
	"github.com/fencegate/fencegate/internal/testkit/natstest"
	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
	"github.com/fencegate/fencegate/internal/testkit/smtptest"
	"github.com/fencegate/fencegate/internal/testkit/testdb"
	"github.com/fencegate/fencegate/test/chaos/internal/chaos"
)

// The short form of the run, in go test ./...: a fixed seed, 20 s of
// faults.
const (
	shortSeed     = 27
	shortDuration = 20 * time.Second
)

var (
	seedFlag     = flag.Uint64("chaos.seed", 1, "seed of the fault schedule and the workers (0: random)")
	durationFlag = flag.Duration("chaos.duration", 60*time.Second, "how long faults are injected")
)

func TestMain(m *testing.M) {
	// The workers are this test binary, run again: no binary of their own
	// to build.
	if os.Getenv(chaos.WorkerEnv) != "" {
		os.Exit(chaos.RunWorker(os.Args[1:]))
	}
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
	// The gateways' idempotency lock timeout is short, so that a paused
	// gateway outlives its locks: another one then recovers the attempt
	// while the paused one may still complete it. The execute timeout
	// (the SMTP reply deadline) is below half of it, as gateway run
	// demands.
	lockTimeout = 3 * time.Second
	execTimeout = 1400 * time.Millisecond
	// ackWait brings a delivery whose gateway crashed or stopped back
	// after 3 s (about twice execTimeout), not after the default minute:
	// during a pause_gateway another gateway takes the paused attempt's
	// key over and recovers it (the path that fault is for), and the
	// drain waits seconds for the redeliveries, not a minute.
	ackWait = 3 * time.Second
	// settleWindow is the lookup settle window: a negative lookup is
	// trusted only this long after the last I/O under the key (for a
	// taken-over attempt, the takeover). It outlasts the front's late
	// stores (at most 3 s after the end of the message, the reply
	// deadline included) and the longest pause_gateway (lockTimeout + 3
	// s): a paused attempt that had passed its owner check may perform
	// its effect that long after, beyond its lock.
	settleWindow = 8 * time.Second
	// lateShare is the percentage of messages the SMTP front stores only
	// after the sender's reply deadline.
	lateShare = 20
)

var crashPoints = []string{failpoint.AfterEffectBeforeRecord, failpoint.AfterRenameBeforeRecord, failpoint.AfterPublishBeforeMark}

// processFaults are the nemesis's faults of processes; the destination
// faults (chaos.SMTPFaults, chaos.HookFaults) arm the SMTP front and the
// webhook receiver to misbehave on their next requests.
var processFaults = []string{"pause_worker", "pause_gateway", "share_holder", "kill9_gateway",
	"crash_gateway_at_failpoint", "restart_nats", "restart_postgres", "kill9_postgres"}

// destinationFaults are the faults of the destinations.
var destinationFaults = append(append([]string(nil), chaos.SMTPFaults...), chaos.HookFaults...)

// deck deals kinds in shuffled rounds: every kind once before any twice,
// so that a run with at least as many slots as kinds injects each.
type deck struct {
	rng   *rand.Rand
	kinds []string
	left  []string
}

func (d *deck) next() string {
	if len(d.left) == 0 {
		d.left = append([]string(nil), d.kinds...)
		d.rng.Shuffle(len(d.left), func(i, j int) { d.left[i], d.left[j] = d.left[j], d.left[i] })
	}
	k := d.left[0]
	d.left = d.left[1:]
	return k
}

// schedule derives the whole fault schedule from the seed: the same seed
// replays the same faults at the same offsets. Process faults come every
// 0.5-2 s, destination faults every 0.3-1.5 s (each armed for 1-3
// requests), until 3 s before the end, so that the last armed faults meet
// traffic; each kind comes once before any comes twice.
func schedule(seed uint64, d time.Duration) []fault {
	rng := rand.New(rand.NewPCG(seed, 0xfa17))
	var out []fault
	procs := &deck{rng: rng, kinds: processFaults}
	for at := time.Second; ; {
		at += time.Duration(500+rng.IntN(1500)) * time.Millisecond
		if at >= d-3*time.Second {
			break
		}
		f := fault{at: at, kind: procs.next()}
		switch f.kind {
		case "pause_worker":
			f.target = rng.IntN(nWorkers)
			f.arg = (workerTTL*2 + time.Duration(rng.IntN(800))*time.Millisecond).String()
		case "pause_gateway":
			// Past the idempotency lock timeout: the paused attempt's key
			// is recovered by another gateway meanwhile.
			f.target = rng.IntN(nGateways)
			f.arg = (lockTimeout + time.Duration(500+rng.IntN(2500))*time.Millisecond).String()
		case "share_holder":
			// Worker target uses the next worker's holder id for a while.
			f.target = rng.IntN(nWorkers)
			f.arg = (time.Duration(2000+rng.IntN(4000)) * time.Millisecond).String()
		case "kill9_gateway":
			f.target = rng.IntN(nGateways)
		case "crash_gateway_at_failpoint":
			f.target = rng.IntN(nGateways)
			f.arg = crashPoints[rng.IntN(len(crashPoints))]
		}
		out = append(out, f)
	}
	dests := &deck{rng: rng, kinds: destinationFaults}
	for at := time.Second; ; {
		at += time.Duration(300+rng.IntN(1200)) * time.Millisecond
		if at >= d-3*time.Second {
			break
		}
		out = append(out, fault{at: at, kind: dests.next(), target: 1 + rng.IntN(3)})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// lateHold decides, from the seed alone, whether the SMTP front stores
// the n-th message with Message-ID id late, and how late: past the reply
// deadline by up to 1.5 s, counted from the end of the message, so the
// sender has given up on the reply before it is stored.
func lateHold(seed uint64, id string, n int) time.Duration {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", seed, id, n)
	v := h.Sum64()
	if v%100 >= lateShare {
		return 0
	}
	return execTimeout + 100*time.Millisecond + time.Duration((v/100)%1400)*time.Millisecond
}

// settleFlag matches a duration flag about the lookup settle window in
// `gateway run --help` ("  --name duration"; older binaries: "  -name
// duration").
var settleFlag = regexp.MustCompile(`(?m)^\s+--?(\S*settle\S*) duration`)

// optionalFlags returns the `gateway run` flags the chaos run passes only
// when the binary's --help lists them (flags other branches add): the
// lookup settle window, settleWindow.
func optionalFlags(t *testing.T, bin string) []string {
	t.Helper()
	r := ft.Gw(t, bin, "", nil, "run", "--help")
	var out []string
	for _, m := range settleFlag.FindAllStringSubmatch(r.Stdout+r.Stderr, -1) {
		out = append(out, "--"+m[1], settleWindow.String())
	}
	t.Logf("chaos: optional gateway flags passed: %v", out)
	return out
}

func TestChaos(t *testing.T) {
	seed, dur := uint64(shortSeed), shortDuration
	requested := false
	flag.Visit(func(f *flag.Flag) { requested = requested || f.Name == "chaos.duration" })
	if requested {
		seed, dur = *seedFlag, *durationFlag
		if seed == 0 {
			seed = rand.Uint64() % 1_000_000
		}
	}
	schema := testdb.Schema()
	t.Logf("chaos: seed %d, duration %s, schema %s (replay: make chaos SEED=%d DURATION=%s)", seed, dur, schema, seed, dur)
	ctx := context.Background()
	setupStart := time.Now()

	// The gateway builds while the servers start.
	built := make(chan error, 1)
	go func() { _, err := ft.BuildGateway(); built <- err }()
	dir := t.TempDir()
	// fsync on, synchronous_commit off at the server: what the gateway
	// acknowledges as decided must survive a kill -9 whatever the server's
	// default (the gateway forces synchronous commit for its decisions). A
	// longer WAL writer delay widens the window in which an asynchronous
	// commit is lost, so a decision that is not forced shows.
	cl, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true, Settings: map[string]string{
		"synchronous_commit": "off", "wal_writer_delay": "500ms"}})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { _ = cl.Stop() })
	db := cl.URL("postgres")
	ns := natstest.StartProcess(t)
	mp := smtptest.StartMailpit(t, "--max", "0")
	// The destinations. The SMTP front stores some messages only after
	// the reply deadline besides the scheduled faults: an unknown outcome
	// whose message does arrive, after the lookup that follows the
	// timeout.
	front, err := chaos.NewSMTPFront(seed, mp.SMTPAddr, execTimeout, func(id string, n int) time.Duration { return lateHold(seed, id, n) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(front.Close)
	hook, err := chaos.NewHookReceiver(seed, execTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hook.Close)
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	bin := ft.Gateway(t)
	schemaEnv := []string{"GATEWAY_SCHEMA=" + schema}
	ft.Expect(t, ft.Gw(t, bin, db, schemaEnv, "migrate"), 0, "")
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := chaos.InstallLogs(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "files")
	const domain = "chaos.fencegate.test"
	// The default unknown-outcome policy (hold), and the receiver is not
	// listed as deduplicating: an outcome lost at either destination is
	// looked up (Mailpit; a payload's lookup_url) or held.
	runArgs := []string{"run", "--nats-url", ns.URL, "--adapters", "email,file,webhook", "--file-root", root,
		"--smtp-addr", front.Addr, "--mail-lookup", "mailpit", "--mailpit-url", mp.BaseURL, "--mail-domain", domain,
		"--webhook-allow", hook.Host,
		"--poll-interval", "200ms", "--relay-timeout", "3s", "--claim-ttl", "5s", "--publish-timeout", "3s", "--log-level", "warn",
		"--execute-timeout", execTimeout.String(), "--idempotency-lock-timeout", lockTimeout.String(),
		"--ack-wait", ackWait.String(),
		"--mail-from-allow", "example.com"}
	runArgs = append(runArgs, optionalFlags(t, bin)...)
	gateways := make([]*ft.Proc, nGateways)
	// Every gateway process started, restarts included: with
	// CHAOS_KEEP_LOGS=DIR a failed run writes their logs there
	// (docs/dev.md).
	var allGw []*ft.Proc
	t.Cleanup(func() {
		if d := os.Getenv("CHAOS_KEEP_LOGS"); d != "" && t.Failed() {
			for k, g := range allGw {
				_ = os.WriteFile(filepath.Join(d, fmt.Sprintf("gw-%d-%d.log", seed, k)), []byte(g.Stderr()), 0o644)
			}
		}
	})
	startGateway := func(i int, fp string) {
		env := schemaEnv
		if fp != "" {
			env = append([]string{failpoint.EnvVar + "=" + fp}, schemaEnv...)
		}
		gateways[i] = ft.Start(t, bin, db, env, runArgs...)
		allGw = append(allGw, gateways[i])
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
		workers[i] = ft.Start(t, os.Args[0], db, []string{chaos.WorkerEnv + "=1"}, "-id", fmt.Sprintf("w%d", i), "-share", fmt.Sprintf("w%d", (i+1)%nWorkers),
			"-seed", strconv.FormatUint(seed*100+uint64(i), 10), "-schema", schema, "-hook", hook.URL,
			"-resources", resources, "-ttl", workerTTL.String(), "-out", out)
	}
	t.Logf("chaos: set up in %s", time.Since(setupStart).Round(100*time.Millisecond))

	// The nemesis. Offsets count from here, after the set-up.
	start := time.Now()
	counts := map[string]int{}
	var crashes []int64
	sched := schedule(seed, dur)
	for _, f := range sched {
		if wait := time.Until(start.Add(f.at)); wait > 0 {
			time.Sleep(wait) // the schedule's offset: the faults' timing
		}
		counts[f.kind]++
		if !slices.Contains(destinationFaults, f.kind) {
			t.Logf("chaos: %6.1fs %s %d %s", time.Since(start).Seconds(), f.kind, f.target, f.arg)
		}
		d, _ := time.ParseDuration(f.arg)
		switch f.kind {
		case "pause_worker":
			w := workers[f.target]
			w.Signal(syscall.SIGSTOP)
			time.AfterFunc(d, func() { w.Signal(syscall.SIGCONT) })
		case "pause_gateway":
			// A killed and restarted gateway is a new process: the
			// SIGCONT goes to the paused one (a no-op once it exited).
			g := gateways[f.target]
			g.Signal(syscall.SIGSTOP)
			time.AfterFunc(d, func() { g.Signal(syscall.SIGCONT) })
		case "share_holder":
			w := workers[f.target]
			w.Signal(syscall.SIGUSR1)
			time.AfterFunc(d, func() { w.Signal(syscall.SIGUSR2) })
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
			crashes = append(crashes, chaos.Mono())
			if err := cl.Kill(); err != nil {
				t.Fatal(err)
			}
			// Kill returns once no process of the old server is left
			// (pgcluster stops the postmaster before killing, so nothing
			// forks past it): the start succeeds at once, however fast
			// the kills come.
			if err := cl.StartAgain(ctx); err != nil {
				t.Fatalf("start PostgreSQL after kill -9: %v", err)
			}
		default: // a destination fault, for the next f.target requests
			if slices.Contains(chaos.SMTPFaults, f.kind) {
				front.Arm(f.kind, f.target)
			} else {
				hook.Arm(f.kind, f.target)
			}
		}
		// A gateway that crashed at its failpoint is restarted plain; one
		// refusing its flags is a broken run; any other exit is logged and
		// counted, and the gateway restarted.
		for i, g := range gateways {
			if !g.Exited() {
				continue
			}
			r, _ := g.Wait(time.Second)
			switch {
			case strings.Contains(r.Stderr, "failpoint: "):
				counts["failpoint_crashes"]++
			case r.Code == 2:
				t.Fatalf("gateway %d refused its flags:\n%s", i, tail(r.Stderr))
			default:
				counts["gateway_exits"]++
				t.Logf("chaos: gateway %d exited by itself (exit %d):\n%s", i, r.Code, tail(r.Stderr))
			}
			startGateway(i, "")
		}
	}
	if wait := time.Until(start.Add(dur)); wait > 0 {
		time.Sleep(wait)
	}

	// Faults stop: workers continue and finish. Armed destination faults
	// stay armed: the drain's requests meet them.
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
	// expired at once, standing in for their lock timeout; fresh gateways
	// recover them by lookup. Held messages and requests reach the
	// destinations first, so the lookups see every effect that will ever
	// happen.
	drainStart := time.Now()
	for _, g := range gateways {
		g.Kill()
	}
	waitDestinations := func(when string) {
		if !front.Wait(time.Minute) || !hook.Wait(time.Minute) {
			t.Fatalf("a destination still holds messages or requests a minute after %s", when)
		}
	}
	waitDestinations("the gateways stopped")
	if _, err := pool.Exec(ctx, testdb.SQL(`UPDATE fencegate.idempotency_keys SET locked_until = now() - interval '1 second' WHERE state = 'started'`)); err != nil {
		t.Fatal(err)
	}
	for i := range gateways {
		startGateway(i, "")
	}
	ft.Poll(t, 3*time.Minute, "the outbox to drain", func() (bool, string) {
		for i, g := range gateways {
			if g.Exited() {
				t.Fatalf("gateway %d exited during the drain:\n%s", i, tail(g.Stderr()))
			}
		}
		var n int
		if err := pool.QueryRow(ctx, testdb.SQL(`SELECT count(*) FROM fencegate.intents WHERE status IN ('pending', 'relayed')`)).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == 0, fmt.Sprintf("%d intents pending or relayed", n)
	})
	for _, g := range gateways {
		g.Kill()
	}
	waitDestinations("the drain")
	drained := time.Since(drainStart)

	// What was injected: a process fault when it was done, a destination
	// fault when a destination applied it.
	injected := map[string]int{}
	for k, v := range counts {
		if !slices.Contains(destinationFaults, k) {
			injected[k] = v
		}
	}
	for _, m := range []map[string]int{front.Injected(), hook.Injected()} {
		for k, v := range m {
			injected[k] += v
		}
	}
	scheduled := map[string]int{}
	for _, f := range sched {
		scheduled[f.kind]++
	}
	secs := int(dur / time.Second)
	floor := chaos.Minimum{Enqueues: 3 * secs, Effects: secs / 2}

	ops, err := chaos.ReadHistory(histories)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := chaos.Check(ctx, chaos.Env{Pool: pool, Schema: schema, MailpitURL: mp.BaseURL, MailDomain: domain, FileRoot: root,
		EmailOnce: true, Crashes: crashes, LateStores: front.LateStores(), MailByIntent: front.StoredByIntent(),
		Hooks: hook.Deliveries(), Min: floor, Faults: scheduled, Injected: injected}, ops)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chaos: seed %d, duration %s, schema %s, %d faults scheduled; drained in %s\n", seed, dur, schema, len(sched), drained.Round(100*time.Millisecond))
	fmt.Fprintf(&b, "faults scheduled: %s\n", fmtCounts(scheduled))
	fmt.Fprintf(&b, "faults injected: %s\n", fmtCounts(injected))
	fmt.Fprintf(&b, "minimum: %d acknowledged enqueues and intents, %d effects at each destination kind\n", floor.Enqueues, floor.Effects)
	fmt.Fprintf(&b, "checked: %s\n", fmtCounts(rep.Stats))
	fmt.Fprintf(&b, "destinations: %s; smtp stored=%d\n", fmtCounts(hook.Stats()), front.Stored())
	for _, kind := range []string{"email", "webhook"} {
		fmt.Fprintf(&b, "%s keys by final status and effects: %s\n", kind, fmtCounts(rep.Deliveries[kind]))
	}
	if effect := effectCounts(t, pool); len(effect) > 0 {
		fmt.Fprintf(&b, "intents by kind, status and effect: %s\n", fmtCounts(effect))
	}
	// R: back-pressure. An intent refused with a Retry-After is never
	// sent again before it (less a second of slack: an HTTP date has whole
	// seconds). Another intent of the same key is not bound by it.
	for _, e := range hook.EarlyRetries() {
		rep.Violations = append(rep.Violations, chaos.Violation{Invariant: "R", Message: e})
	}
	per := map[string]int{}
	for _, v := range rep.Violations {
		per[v.Invariant]++
	}
	fmt.Fprintf(&b, "violations: %d (%s)\n", len(rep.Violations), fmtCounts(per))
	for _, v := range rep.Violations {
		fmt.Fprintf(&b, "  - %s\n", v)
		if v.Evidence != "" {
			fmt.Fprintf(&b, "    history:\n      %s\n", strings.ReplaceAll(strings.TrimSpace(v.Evidence), "\n", "\n      "))
		}
	}
	t.Log(b.String())
	if len(rep.Violations) > 0 {
		t.Fatalf("chaos: %d violations with seed %d", len(rep.Violations), seed)
	}
	t.Logf("chaos: done in %s", time.Since(start).Round(time.Second))
}

// effectCounts counts the intents by kind, status and effect where the
// intents table has the effect column (by kind and status otherwise).
func effectCounts(t *testing.T, pool *pgxpool.Pool) map[string]int {
	rows, err := pool.Query(context.Background(), testdb.SQL(`
		SELECT kind || '/' || status || coalesce('/' || (to_jsonb(i)->>'effect'), ''), count(*)
		FROM fencegate.intents i GROUP BY 1`))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func tail(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
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
