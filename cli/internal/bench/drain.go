package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/internal/deployment"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/outbox"
)

// RunHooks let gateway bench run `gateway run` in its own process, through
// the command itself (its flags' defaults, its pool sizing, its start-up
// checks): the bench's no-op adapter is added, and the bench learns when
// the stack runs.
type RunHooks struct {
	// Adapters run beside the built-in ones (gateway.Config.Adapters).
	Adapters []adapters.Registration
	// Started is called once the stack runs, with the process's pool.
	Started func(pool *pgxpool.Pool)
}

// gatewayRun is a `gateway run` running in the bench's process.
type gatewayRun struct {
	maxConns int32 // its pool's MaxConns
	cancel   context.CancelFunc
	done     chan int
	out      *tailWriter
	// stopTimeout is how long the run waits for its components to stop.
	stopTimeout time.Duration
}

// runGateway starts `gateway run` in this process on the benchmark's
// database and NATS server with its shipped defaults and --adapters ""
// (the bench's workload has no email or file intent), plus the no-op
// adapter when noop is set (else it relays only), and returns once it
// runs.
func (e *benchEnv) runGateway(ctx context.Context, noop bool) (*gatewayRun, error) {
	args := []string{"--schema", e.schema.Name(), "--database-url", e.dbURL, "--nats-url", e.natsURL, "--adapters", ""}
	if e.fsyncOff {
		args = append(args, "--allow-fsync-off")
	}
	started := make(chan int32, 1)
	h := RunHooks{Started: func(pool *pgxpool.Pool) { started <- pool.Config().MaxConns }}
	if noop {
		h.Adapters = []adapters.Registration{NoopRegistration()}
	}
	out := &tailWriter{max: 16 << 10}
	rctx, cancel := context.WithCancel(ctx)
	g := &gatewayRun{cancel: cancel, done: make(chan int, 1), out: out, stopTimeout: e.stopTimeout}
	go func() { g.done <- e.gatewayMain(rctx, args, out, h) }()
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case g.maxConns = <-started:
		return g, nil
	case code := <-g.done:
		cancel()
		return nil, fmt.Errorf("gateway run exited %d at start: %s", code, out.String())
	case <-t.C:
		cancel()
		<-g.done
		return nil, fmt.Errorf("gateway run did not start within a minute: %s", out.String())
	}
}

// stop stops the run as SIGTERM does and waits for it to exit.
func (g *gatewayRun) stop() error {
	g.cancel()
	t := time.NewTimer(g.stopTimeout + 10*time.Second)
	defer t.Stop()
	select {
	case code := <-g.done:
		if code != errmap.ExitOK {
			return fmt.Errorf("gateway run exited %d: %s", code, g.out.String())
		}
		return nil
	case <-t.C:
		return errors.New("gateway run did not stop")
	}
}

// tailWriter keeps the last max bytes written (an in-process gateway run's
// logs, for an error message).
type tailWriter struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if over := len(w.b) - w.max; over > 0 {
		w.b = append(w.b[:0], w.b[over:]...)
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return errmap.OneLine(string(w.b))
}

// waitDone polls until no intent of the backlog (ids lo..hi) is left
// matching left (a condition on a row: "still pending", "not completed"),
// or until deadline (an error). It walks the primary key with a cursor
// — the lowest id that may still match — so each probe reads only the
// rows finished since the last one plus one: over a whole drain about one
// read per intent. (Probing the partial indexes instead, "status IN
// ('pending','relayed')", cost 4-36 ms a call in pg_stat_statements, up to
// half a core of PostgreSQL's during e2e-drain: the benchmark measuring
// itself.)
//
// It asks through q: the bench's pool, or during a budget the one
// connection the bench measures through. Its probe carries benchTag, so
// the budget's statement count leaves it out.
func (e *benchEnv) waitDone(ctx context.Context, q querier, what, left string, lo, hi int64, deadline time.Time) error {
	probe := benchTag + `SELECT coalesce(min(intent_id), 0) FROM (
		SELECT intent_id FROM fencegate.intents WHERE intent_id >= $1 AND intent_id <= $2 AND (` + left + `)
		ORDER BY intent_id LIMIT 1) first`
	for {
		var next int64
		if err := q.QueryRow(ctx, e.schema.SQL(probe), lo, hi).Scan(&next); err != nil {
			return err
		}
		if next == 0 {
			return nil
		}
		lo = next
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not done by %s", what, deadline.Format(time.TimeOnly))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// backlogRange is the lowest and highest intent id in the outbox.
func (e *benchEnv) backlogRange(ctx context.Context) (lo, hi int64, err error) {
	err = e.pool.QueryRow(ctx, e.schema.SQL(`SELECT coalesce(min(intent_id), 0), coalesce(max(intent_id), 0) FROM fencegate.intents`)).Scan(&lo, &hi)
	return lo, hi, err
}

// purgeNoop removes the no-op kind's messages from the stream, so that a
// later run's consumer does not receive messages of intents a reset
// deleted. Only the bench makes noop intents.
func (e *benchEnv) purgeNoop(ctx context.Context) error {
	nc, err := e.connectNATS()
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// The gateway ran with the database's namespace.
	info, err := deployment.Resolve(ctx, e.pool, e.schema.Name())
	if err != nil {
		return err
	}
	st, err := js.Stream(ctx, info.Namespace.Stream())
	if err != nil {
		return err
	}
	return st.Purge(ctx, jetstream.WithPurgeSubject(info.Namespace.Subject("noop")))
}

// caseE2EDrain: a backlog of committed noop intents drained by `gateway
// run` as shipped (relay and adapter runtime, no-op adapter) until every
// outcome is recorded, against the relay alone (`gateway run --adapters
// ""`, every intent relayed) on the same backlog in the same run. Both are
// timed from starting the process. The drain's budget per settled intent
// is measured around it (budget.go); with --river-peer, River's per worked
// job on the same server after it.
func (e *benchEnv) caseE2EDrain(ctx context.Context) ([]Result, error) {
	n := e.drainN
	var budget *Budget
	drainOnce := func(noop bool) (float64, int32, error) {
		if err := e.reset(ctx); err != nil {
			return 0, 0, err
		}
		if err := e.backlog(ctx, n, "pending", e.noopIntent); err != nil {
			return 0, 0, err
		}
		lo, hi, err := e.backlogRange(ctx)
		if err != nil {
			return 0, 0, err
		}
		var m *budgetMeter
		var q querier = e.pool
		if noop {
			if m, err = e.startMeter(ctx); err != nil {
				return 0, 0, err
			}
			defer m.close()
			q = m.conn
		}
		start := time.Now()
		g, err := e.runGateway(ctx, noop)
		if err != nil {
			return 0, 0, err
		}
		what, left := "relay", `status = 'pending'`
		if noop {
			what, left = "drain", `completed_at IS NULL`
		}
		werr := e.waitDone(ctx, q, what, left, lo, hi, start.Add(10*time.Minute))
		rate := float64(n) / time.Since(start).Seconds()
		if m != nil && werr == nil {
			// The gateway's connections are read before it stops: they
			// close with it.
			m.readRequests()
		}
		if err := errors.Join(werr, g.stop()); err != nil {
			return 0, 0, err
		}
		if noop {
			if budget, err = m.finish(ctx, n); err != nil {
				return 0, 0, err
			}
			var ok int
			if err := e.pool.QueryRow(ctx, e.schema.SQL(`SELECT count(*) FROM fencegate.intents WHERE status = 'succeeded'`)).Scan(&ok); err != nil {
				return 0, 0, err
			}
			if ok != n {
				return 0, 0, fmt.Errorf("drain: %d of %d intents succeeded", ok, n)
			}
		}
		return rate, g.maxConns, e.purgeNoop(ctx)
	}
	relay, relayConns, err := drainOnce(false)
	if err != nil {
		return nil, err
	}
	drain, conns, err := drainOnce(true)
	if err != nil {
		return nil, err
	}
	// The goal: at least River's worked rate on this machine (7,700-10,600
	// jobs/s with a 5 ms fetch cooldown; docs/performance.md).
	const riverRate = 7700
	out := []Result{{
		Name: "e2e-drain", Unit: "intents/s", Value: drain, Baseline: relay, Ratio: ratioOf(drain, relay),
		Goal: ">= 7700/s (River's worked rate here)", Met: drain >= riverRate,
		Note: fmt.Sprintf("backlog of %d committed intents drained to recorded outcomes by gateway run as shipped with the no-op adapter (db_max_conns=%d); baseline: the relay alone on the same backlog (db_max_conns=%d)",
			n, conns, relayConns),
		Budget: budget,
	}}
	if e.riverPeer != "" {
		river, err := e.runRiver(ctx, n)
		if err != nil {
			return nil, fmt.Errorf("River's peer: %w", err)
		}
		out[0].River = river
		out = append(out, Result{
			Name: "e2e-drain-vs-river", Unit: "intents/s", Value: drain, Baseline: river.Rate, Ratio: ratioOf(drain, river.Rate),
			Goal: "ratio >= 1.5", Met: ratioOf(drain, river.Rate) >= 1.5,
			Note: fmt.Sprintf("baseline: River v0.51.2 working %d no-op jobs (100 workers, 5 ms fetch cooldown) on the same server right after the drain", n),
		})
	}
	return out, nil
}

// caseFileDrain: 8 concurrent publications (gateway run's adapter
// concurrency) through the file adapter's publish path (Execute, as
// shipped: lock, manifest ahead, staged content, rename, directory fsyncs
// shared), each a new file in one directory, against the same
// concurrency doing the least a durable atomic publication needs: write a
// temporary file, fsync it, rename it into place, fsync the directory.
func (e *benchEnv) caseFileDrain(ctx context.Context) ([]Result, error) {
	a, err := file.New(file.Config{Root: filepath.Join(e.fileDir, "adapter")})
	if err != nil {
		return nil, err
	}
	rawDir := filepath.Join(e.fileDir, "raw", "out")
	if err := os.MkdirAll(rawDir, 0o755); err != nil {
		return nil, err
	}
	content := strings.Repeat("x", benchPayloadBytes)
	var seq atomic.Int64
	publish := func(ctx context.Context, _ int, _ *uint64) (int, error) {
		n := seq.Add(1)
		key := "bench/op-" + strconv.FormatInt(n, 10)
		p, err := json.Marshal(map[string]string{"target": "out/f-" + strconv.FormatInt(n, 10), "content": content})
		if err != nil {
			return 0, err
		}
		out, err := a.Execute(ctx, adapters.Request{IntentID: n, Resource: "bench", Epoch: 1, Kind: file.Kind,
			IdempotencyKey: key, Fence: outbox.FenceExecute, Payload: p, Attempt: 1})
		if err != nil {
			return 0, err
		}
		if out.Status != outbox.StatusSucceeded {
			return 0, fmt.Errorf("file publication %d: %s", n, out.Status)
		}
		return 1, nil
	}
	dirs := make([]*os.File, benchFileWorkers)
	for i := range dirs {
		if dirs[i], err = os.Open(rawDir); err != nil {
			return nil, err
		}
		defer dirs[i].Close()
	}
	body := []byte(content)
	raw := func(_ context.Context, w int, _ *uint64) (int, error) {
		name := "f-" + strconv.FormatInt(seq.Add(1), 10)
		tmp := filepath.Join(rawDir, "."+name+".tmp")
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return 0, err
		}
		_, err = f.Write(body)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, filepath.Join(rawDir, name))
		}
		if err == nil {
			err = dirs[w].Sync()
		}
		return 1, err
	}
	rawRate, pubRate, err := alternate(e.d,
		func(d time.Duration) (float64, error) { return measure(ctx, d, benchFileWorkers, raw) },
		func(d time.Duration) (float64, error) { return measure(ctx, d, benchFileWorkers, publish) })
	if err != nil {
		return nil, err
	}
	// The goal: a publication needs 3 file fsyncs (staged content, the
	// manifest ahead, the mark) and 2 directory fsyncs in sequence, the
	// baseline 1 and 1, so 2/5 of the baseline if every fsync cost the
	// same and none were shared.
	return []Result{ratioResult("file-drain", "files/s", pubRate, rawRate, 0.4,
		fmt.Sprintf("%d concurrent publications of %d bytes, a new file each, into one directory (%s); baseline: write, fsync, rename, fsync the directory, same concurrency",
			benchFileWorkers, benchPayloadBytes, fsType(e.fileDir)))}, nil
}

// fsType names the file system dir is on (tmpfs makes fsync free, and
// file-drain meaningless).
func fsType(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "unknown"
	}
	switch uint64(st.Type) {
	case 0xEF53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x01021994:
		return "tmpfs"
	case 0x794C7630:
		return "overlayfs"
	}
	return fmt.Sprintf("0x%x", uint64(st.Type))
}
