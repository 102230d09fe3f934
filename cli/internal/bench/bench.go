// Package bench is the benchmark framework of gateway bench: each case
// next to its physical baseline, measured in the same run on the same
// servers (a throwaway durable PostgreSQL cluster and an embedded JetStream
// server, or the ones given). The command line parses the flags into a
// Config and prints the Report; the e2e cases run `gateway run` in this
// process through Config.RunGateway, so this package does not import the
// command line.
package bench

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/migrations"
	"github.com/fencegate/fencegate/outbox"
)

// Shape of the workload, fixed so runs compare.
const (
	benchWorkers       = 16
	benchResources     = 1000
	benchPayloadBytes  = 512
	benchBatchSize     = 100
	benchBatchWorkers  = 4
	benchE2ERate       = 500
	benchGrowthRows    = 1_000_000
	benchRelayPerSec   = 10_000 // relay backlog per second of --duration
	benchGroupFlushers = 8
	benchDrainIntents  = 50_000 // e2e-drain's backlog (--drain-intents)
	// benchE2EWarmup is how long e2e-latency offers its rate before it
	// measures (at most --duration).
	benchE2EWarmup = 2 * time.Second
	// benchFileWorkers is file-drain's concurrency: gateway run's
	// --adapter-concurrency default, the publications one file adapter
	// makes at once.
	benchFileWorkers = 8
)

// benchCases are the cases in the order they run.
var benchCases = []string{"enqueue", "enqueue-batch", "enqueue-group", "relay", "file-drain", "e2e-latency", "e2e-drain", "growth"}

// benchGroups are names --case accepts for several cases: "e2e" is every
// end-to-end case (latency, drain, and both again with a million
// completed intents preloaded).
var benchGroups = map[string][]string{"e2e": {"e2e-latency", "e2e-drain", "growth"}}

// SelectCases parses --case: a comma-separated list of cases and groups,
// or "all"; the cases come back once each, in run order.
func SelectCases(list string) ([]string, error) {
	if list == "all" {
		return benchCases, nil
	}
	want := map[string]bool{}
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		switch {
		case benchGroups[name] != nil:
			for _, c := range benchGroups[name] {
				want[c] = true
			}
		case slices.Contains(benchCases, name):
			want[name] = true
		default:
			return nil, errmap.Invalid("case", fmt.Sprintf("unknown case %q; cases are %s, groups e2e (%s), or all",
				name, strings.Join(benchCases, ", "), strings.Join(benchGroups["e2e"], ", ")))
		}
	}
	var cases []string
	for _, c := range benchCases {
		if want[c] {
			cases = append(cases, c)
		}
	}
	return cases, nil
}

// Result is one measured line: a value next to its physical baseline
// measured in the same run on the same servers.
type Result struct {
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Value    float64 `json:"value"`
	Baseline float64 `json:"baseline"`
	// Ratio is Value/Baseline (0 when there is no baseline).
	Ratio float64 `json:"ratio"`
	// Goal says what the case aims at, e.g. "ratio >= 0.7".
	Goal string `json:"goal"`
	Met  bool   `json:"met"`
	Note string `json:"note,omitempty"`
	// Budget is what PostgreSQL and the gateway spent per unit (e2e-drain
	// only: per settled intent).
	Budget *Budget `json:"budget,omitempty"`
	// River is River's run beside it (e2e-drain with --river-peer).
	River *RiverRun `json:"river,omitempty"`
}

// benchEnv is what the cases share: the servers and the values one case
// hands to a later one.
type benchEnv struct {
	pool    *pgxpool.Pool
	schema  pgschema.Schema // Config.Schema
	dbURL   string          // the benchmark's database, for gateway run
	natsURL string
	// fsyncOff: the server runs with fsync=off (only a --database-url
	// server can); gateway run then needs --allow-fsync-off.
	fsyncOff bool
	drainN   int    // e2e-drain's backlog
	fileDir  string // where file-drain publishes
	d        time.Duration
	payload  []byte
	seq      atomic.Int64
	log      io.Writer
	// gatewayMain and stopTimeout are Config's: `gateway run` in this
	// process, and how long it takes at most to stop.
	gatewayMain func(ctx context.Context, args []string, out io.Writer, hooks RunHooks) int
	stopTimeout time.Duration

	// The budget's handles (budget.go): the benchmark database's name and
	// oid, the server's postmaster (the bench's own server's, or a given
	// server's when it runs on this machine; else why not), its TCP port
	// (0: not TCP), and why pg_stat_statements cannot be read ("" when it
	// can, in the benchmark's database).
	dbName   string
	dbOID    int64
	pg       serverProcs
	pgPort   int
	stmtsOff string
	// River's side of the budget (--river-peer): the peer's binary and the
	// database it works in, on the same server, with a pool on it.
	riverPeer string
	riverDB   string
	riverURL  string
	riverPool *pgxpool.Pool
	// natsEmbedded: the JetStream server runs in this process.
	natsEmbedded bool

	rawInsertRate float64 // case enqueue's baseline
	enqueueRate   float64 // case enqueue's value
	e2eP50        float64
	e2eMaxRate    float64
}

// DefaultDrainIntents is e2e-drain's backlog unless told (--drain-intents).
const DefaultDrainIntents = benchDrainIntents

// Cases are the cases in the order they run.
func Cases() []string { return slices.Clone(benchCases) }

// Config is one benchmark run: what the flags of gateway bench chose, and
// what the command line hands the benchmark (how it connects, how it runs
// `gateway run`).
type Config struct {
	// Cases are the cases to run, once each, in run order (SelectCases).
	Cases []string
	// Duration is the length of each measurement.
	Duration time.Duration
	// DrainIntents is e2e-drain's backlog of committed intents.
	DrainIntents int
	// FileDir is the directory file-drain publishes in, on the disk to
	// measure ("": a new temporary directory).
	FileDir string
	// DatabaseURL and NATSURL are running servers to use ("": the
	// throwaway ones the benchmark starts). On a given PostgreSQL it works
	// in a database of its own, created and dropped by it.
	DatabaseURL, NATSURL string
	// Schema is the PostgreSQL schema the benchmark's database is migrated
	// into, and every part of it works in. Default: "fencegate".
	Schema string
	// RiverPeer, when set, is the riverwork binary (cli/internal/bench/
	// riverwork) that e2e-drain runs after fencegate's drain, on the same
	// server, to measure River's budget per worked job.
	RiverPeer string
	// CPUProfile, when set, is the file a Go CPU profile of the cases is
	// written to.
	CPUProfile string
	// Log receives the progress lines.
	Log io.Writer
	// Connect opens a pool on a database URL and checks it answers (the
	// command line's connect), for the benchmark's administrative
	// connection: creating and dropping its database.
	Connect func(ctx context.Context, dbURL string) (*pgxpool.Pool, error)
	// RunGateway runs `gateway run` with args in this process until ctx
	// ends, its stdout and stderr on out, with hooks, and returns its exit
	// code. It must not read the environment: everything it uses is in
	// args.
	RunGateway func(ctx context.Context, args []string, out io.Writer, hooks RunHooks) int
	// StopTimeout is how long gateway run waits for its components to stop
	// before it gives up.
	StopTimeout time.Duration
}

// validate checks the values the flags gave, before anything starts.
func (c Config) validate() error {
	if c.Duration < 100*time.Millisecond || c.Duration > 10*time.Minute {
		return errmap.Invalid("duration", "--duration must be between 100ms and 10m")
	}
	if c.DrainIntents < 100 || c.DrainIntents > 10_000_000 {
		return errmap.Invalid("drain_intents", "--drain-intents must be between 100 and 10,000,000")
	}
	if c.RiverPeer != "" {
		if fi, err := os.Stat(c.RiverPeer); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return errmap.Invalid("river_peer", fmt.Sprintf("--river-peer %q is not an executable file", c.RiverPeer))
		}
	}
	if c.FileDir != "" {
		if fi, err := os.Stat(c.FileDir); err != nil || !fi.IsDir() {
			return errmap.Invalid("file_dir", fmt.Sprintf("--file-dir %q is not a directory", c.FileDir))
		}
	}
	return nil
}

// Report is what a run measured: every case's rows, in run order, and a
// description of the machine.
type Report struct {
	Cases    []Result
	Machine  map[string]any
	Duration time.Duration
}

// Bench is a started benchmark: its servers and database, until Close.
type Bench struct {
	cfg     Config
	env     *benchEnv
	machine map[string]any
	cleanup func()
}

// Start checks cfg, connects to (or starts) PostgreSQL and NATS, and
// creates and migrates the benchmark's database. Close removes it all.
func Start(ctx context.Context, cfg Config) (*Bench, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	env, machine, cleanup, err := startBench(ctx, cfg, cfg.DatabaseURL, cfg.NATSURL)
	if err != nil {
		return nil, err
	}
	env.d, env.drainN = cfg.Duration, cfg.DrainIntents
	return &Bench{cfg: cfg, env: env, machine: machine, cleanup: cleanup}, nil
}

// Close stops what Start started and drops the benchmark's database.
func (b *Bench) Close() { b.cleanup() }

// Run runs the cases, in order, and returns their rows; progress goes to
// Config.Log.
func (b *Bench) Run(ctx context.Context) (*Report, error) {
	env, machine := b.env, b.machine
	if slices.Contains(b.cfg.Cases, "file-drain") {
		dir, err := os.MkdirTemp(b.cfg.FileDir, "fencegate-bench-files-")
		if err != nil {
			return nil, errmap.Invalid("file_dir", err.Error())
		}
		defer os.RemoveAll(dir)
		env.fileDir = dir
		machine["file_dir_fs"] = fsType(dir)
	}
	if b.cfg.CPUProfile != "" {
		f, err := os.Create(b.cfg.CPUProfile)
		if err != nil {
			return nil, errmap.Invalid("cpuprofile", err.Error())
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}

	var results []Result
	for _, c := range b.cfg.Cases {
		fmt.Fprintf(b.cfg.Log, "gateway bench: %s…\n", c)
		start := time.Now()
		rs, err := env.run(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("bench %s: %w", c, err)
		}
		fmt.Fprintf(b.cfg.Log, "gateway bench: %s done in %s\n", c, time.Since(start).Round(time.Millisecond))
		results = append(results, rs...)
		if c == "e2e-latency" {
			machine["peak_rss_mb_e2e"] = peakRSSMB()
		}
	}
	machine["peak_rss_mb"] = peakRSSMB()
	return &Report{Cases: results, Machine: machine, Duration: env.d}, nil
}

// startBench connects to (or starts) PostgreSQL and NATS, creates and
// migrates a database of its own, and returns the environment, a
// description of the machine and a cleanup function. What it starts is on
// a startstop.Group, as the gateway's parts: the cleanup (or a failed
// start) stops it in reverse order.
func startBench(ctx context.Context, cfg Config, dbURL, natsURL string) (*benchEnv, map[string]any, func(), error) {
	parts := &startstop.Group{}
	fail := func(err error) (*benchEnv, map[string]any, func(), error) {
		parts.StopAll()
		return nil, nil, nil, err
	}
	machine := map[string]any{
		"cpus": runtime.NumCPU(), "go": runtime.Version(), "os": runtime.GOOS, "arch": runtime.GOARCH,
		"cpu_model": cpuModel(), "memory_mb": memTotalMB(),
	}
	var pg serverProcs
	if dbURL == "" {
		fmt.Fprintln(cfg.Log, "gateway bench: starting a throwaway PostgreSQL cluster (fsync on)…")
		// pg_stat_statements counts the statements of e2e-drain's budget;
		// loaded, it costs each statement a hash-table update, the same
		// for fencegate and River.
		c, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true, Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements"}})
		if err != nil {
			return fail(errmap.New(errmap.Unavailable, "start PostgreSQL: "+errmap.OneLine(err.Error())))
		}
		parts.Add("PostgreSQL", func() { _ = c.Stop() }, nil)
		dbURL = c.URL("postgres")
		pg.pid = c.PID()
		machine["postgres"] = "throwaway, fsync on"
	} else {
		machine["postgres"] = "given by --database-url"
	}
	admin, err := cfg.Connect(ctx, dbURL)
	if err != nil {
		return fail(err)
	}
	if pg.pid == 0 {
		// A given server's CPU is measured too when it runs here: all of
		// it, every database's backends included (the note says so).
		pg.pid, pg.off = localPostmaster(ctx, admin)
	}
	machine["postgres_cpu_measured"] = pg.pid > 0
	name := "fencegate_bench_" + randHex(6)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close()
		return fail(fmt.Errorf("create the benchmark database: %w", err))
	}
	parts.Add("benchmark database", func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = admin.Exec(dctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		admin.Close()
	}, nil)
	var version, fsync string
	_ = admin.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('fsync')").Scan(&version, &fsync)
	machine["postgres_version"], machine["postgres_fsync"] = version, fsync

	pcfg, err := pgxpool.ParseConfig(withDB(dbURL, name))
	if err != nil {
		return fail(err)
	}
	pcfg.MaxConns = 64
	pcfg.ConnConfig.RuntimeParams["application_name"] = benchAppName
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fail(err)
	}
	parts.Add("database pool", pool.Close, nil)
	if _, err := migrations.Up(ctx, pool, migrations.Config{Schema: cfg.Schema}); err != nil {
		return fail(err)
	}
	if _, err := pool.Exec(ctx, pgschema.MustParse(cfg.Schema).SQL(`INSERT INTO fencegate.resources (resource_id, epoch) SELECT 'bench-' || g, 1 FROM generate_series(0, $1 - 1) g`), benchResources); err != nil {
		return fail(fmt.Errorf("create resources: %w", err))
	}

	var dbOID int64
	if err := pool.QueryRow(ctx, benchTag+`SELECT oid::int8 FROM pg_database WHERE datname = current_database()`).Scan(&dbOID); err != nil {
		return fail(err)
	}
	// The extension's view is created in the benchmark's database, which
	// is dropped afterwards; on a given server without the library loaded
	// it stays unreadable and the budget leaves its column out.
	stmtsOff := ""
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		stmtsOff = "pg_stat_statements is not available: " + errmap.OneLine(err.Error())
	} else if _, err := pool.Exec(ctx, benchTag+`SELECT 1 FROM pg_stat_statements LIMIT 1`); err != nil {
		stmtsOff = "pg_stat_statements is not loaded (shared_preload_libraries): " + errmap.OneLine(err.Error())
	}
	machine["pg_stat_statements"] = stmtsOff == ""

	var riverDB, riverURL string
	var riverPool *pgxpool.Pool
	if cfg.RiverPeer != "" {
		riverDB = name + "_river"
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+riverDB); err != nil {
			return fail(fmt.Errorf("create River's database: %w", err))
		}
		parts.Add("River's database", func() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, _ = admin.Exec(dctx, "DROP DATABASE IF EXISTS "+riverDB+" WITH (FORCE)")
		}, nil)
		riverURL = withDB(dbURL, riverDB)
		rcfg, err := pgxpool.ParseConfig(riverURL)
		if err != nil {
			return fail(err)
		}
		rcfg.MaxConns = 2
		rcfg.ConnConfig.RuntimeParams["application_name"] = benchAppName
		if riverPool, err = pgxpool.NewWithConfig(ctx, rcfg); err != nil {
			return fail(err)
		}
		parts.Add("River's pool", riverPool.Close, nil)
	}

	if natsURL == "" {
		dir, err := os.MkdirTemp("", "fencegate-bench-nats-")
		if err != nil {
			return fail(err)
		}
		parts.Add("NATS data directory", func() { _ = os.RemoveAll(dir) }, nil)
		srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
		if err != nil {
			return fail(fmt.Errorf("embedded NATS: %w", err))
		}
		srv.Start()
		parts.Add("NATS", func() { srv.Shutdown(); srv.WaitForShutdown() }, nil)
		if !srv.ReadyForConnections(10 * time.Second) {
			return fail(errors.New("embedded NATS not ready in 10s"))
		}
		natsURL = srv.ClientURL()
		machine["nats"] = "embedded nats-server, in this process"
	} else {
		machine["nats"] = "given by --nats-url"
	}
	env := &benchEnv{pool: pool, schema: pgschema.MustParse(cfg.Schema), dbURL: withDB(dbURL, name), natsURL: natsURL, fsyncOff: fsync == "off",
		log: cfg.Log, payload: benchPayload(), gatewayMain: cfg.RunGateway, stopTimeout: cfg.StopTimeout,
		dbName: name, dbOID: dbOID, pg: pg, pgPort: pgTCPPort(dbURL), stmtsOff: stmtsOff,
		riverPeer: cfg.RiverPeer, riverDB: riverDB, riverURL: riverURL, riverPool: riverPool, natsEmbedded: cfg.NATSURL == ""}
	return env, machine, parts.StopAll, nil
}

// benchPayload is a valid "file" payload of exactly benchPayloadBytes.
func benchPayload() []byte {
	head, tail := `{"target":"out/bench.txt","content":"`, `"}`
	return []byte(head + strings.Repeat("x", benchPayloadBytes-len(head)-len(tail)) + tail)
}

func withDB(raw, db string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.Path = "/" + db
	return u.String()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (e *benchEnv) run(ctx context.Context, name string) ([]Result, error) {
	switch name {
	case "enqueue":
		return e.caseEnqueue(ctx)
	case "enqueue-batch":
		return e.caseBatch(ctx)
	case "enqueue-group":
		return e.caseGroup(ctx)
	case "relay":
		return e.caseRelay(ctx)
	case "file-drain":
		return e.caseFileDrain(ctx)
	case "e2e-latency":
		return e.caseE2E(ctx, "e2e")
	case "e2e-drain":
		return e.caseE2EDrain(ctx)
	case "growth":
		return e.caseGrowth(ctx)
	}
	return nil, fmt.Errorf("unknown case %q", name)
}

// reset empties the outbox, so a case does not inherit another's rows (or
// a dispatcher another case's pending intents).
func (e *benchEnv) reset(ctx context.Context) error {
	if _, err := e.pool.Exec(ctx, e.schema.SQL(`TRUNCATE fencegate.intents, fencegate.idempotency_keys CASCADE`)); err != nil {
		return err
	}
	_, err := e.pool.Exec(ctx, e.schema.SQL(`VACUUM ANALYZE fencegate.intents`))
	return err
}

// intent returns a new intent on a random resource.
func (e *benchEnv) intent(rnd uint64) outbox.Intent {
	n := e.seq.Add(1)
	return outbox.Intent{
		Resource: "bench-" + strconv.FormatUint(rnd%benchResources, 10), Epoch: 1,
		OperationID: "op-" + strconv.FormatInt(n, 10), Kind: "file", Payload: e.payload,
	}
}

// measure runs fn on workers goroutines for d and returns the operations
// per second they counted.
func measure(ctx context.Context, d time.Duration, workers int, fn func(ctx context.Context, w int, rnd *uint64) (int, error)) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var total atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for w := range workers {
		wg.Go(func() {
			rnd := uint64(w)*0x9E3779B97F4A7C15 + uint64(start.UnixNano())
			for time.Now().Before(deadline) && ctx.Err() == nil {
				rnd = rnd*6364136223846793005 + 1442695040888963407
				r := rnd >> 16
				n, err := fn(ctx, w, &r)
				if err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
				total.Add(int64(n))
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(total.Load()) / time.Since(start).Seconds(), nil
}

// alternate measures a and b twice each, interleaved (a, b, a, b), each for
// half the duration, so drift in the machine's load (other processes on
// shared cores) hits both alike. It returns the mean rates.
func alternate(d time.Duration, a, b func(time.Duration) (float64, error)) (float64, float64, error) {
	var ra, rb float64
	for range 2 {
		x, err := a(d / 2)
		if err != nil {
			return 0, 0, err
		}
		y, err := b(d / 2)
		if err != nil {
			return 0, 0, err
		}
		ra, rb = ra+x/2, rb+y/2
	}
	return ra, rb, nil
}

// listen keeps a connection LISTENing as a running dispatcher would, so
// NOTIFY costs what it costs in production. It returns a stop function.
func (e *benchEnv) listen(ctx context.Context) (func(), error) {
	conn, err := pgx.Connect(ctx, e.pool.Config().ConnString())
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+e.schema.IntentsChannel()); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := conn.WaitForNotification(lctx); err != nil {
				return
			}
		}
	}()
	return func() { cancel(); <-done; _ = conn.Close(context.Background()) }, nil
}

// enqueuer opens an outbox client with cfg (in the bench's schema) beside a
// listening connection (listen); stop closes the listener.
func (e *benchEnv) enqueuer(ctx context.Context, cfg outbox.Config) (ob *outbox.Client, stop func(), err error) {
	if stop, err = e.listen(ctx); err != nil {
		return nil, nil, err
	}
	cfg.Schema = e.schema.Name()
	if ob, err = outbox.New(e.pool, cfg); err != nil {
		stop()
		return nil, nil, err
	}
	return ob, stop, nil
}

// freshEnqueuer is enqueuer on an emptied outbox (reset).
func (e *benchEnv) freshEnqueuer(ctx context.Context, cfg outbox.Config) (*outbox.Client, func(), error) {
	if err := e.reset(ctx); err != nil {
		return nil, nil, err
	}
	return e.enqueuer(ctx, cfg)
}

const rawInsertSQL = `INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
	VALUES ($1, $2, $3, $4, $5, $6, $7)`

// rawInsert is the physical baseline of one enqueue: BEGIN; INSERT the same
// row; COMMIT, with no lock, no epoch check, no dedup.
func (e *benchEnv) rawInsert(ctx context.Context, rnd uint64) error {
	in := e.intent(rnd)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, e.schema.SQL(rawInsertSQL), in.Resource, in.Epoch, in.OperationID, in.Kind,
		in.Resource+"/"+in.OperationID, "execute", string(in.Payload)); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return tx.Commit(ctx)
}

func (e *benchEnv) rawInsertRateFor(ctx context.Context, d time.Duration) (float64, error) {
	return measure(ctx, d, benchWorkers, func(ctx context.Context, _ int, rnd *uint64) (int, error) {
		return 1, e.rawInsert(ctx, *rnd)
	})
}

func (e *benchEnv) enqueueRateFor(ctx context.Context, ob *outbox.Client, d time.Duration) (float64, error) {
	return measure(ctx, d, benchWorkers, func(ctx context.Context, _ int, rnd *uint64) (int, error) {
		_, err := ob.Enqueue(ctx, e.intent(*rnd))
		return 1, err
	})
}

func ratioResult(name, unit string, value, baseline, goal float64, note string) Result {
	r := Result{Name: name, Unit: unit, Value: value, Baseline: baseline, Goal: fmt.Sprintf("ratio >= %.1f", goal), Note: note}
	if baseline > 0 {
		r.Ratio = value / baseline
	}
	r.Met = r.Ratio >= goal
	return r
}

// caseEnqueue: fenced Enqueue, one intent per transaction, 16 workers over
// 1,000 resources, against BEGIN; INSERT; COMMIT of the same row.
func (e *benchEnv) caseEnqueue(ctx context.Context) ([]Result, error) {
	raw, fenced, err := e.enqueueAgainstRaw(ctx, outbox.Config{})
	if err != nil {
		return nil, err
	}
	e.rawInsertRate, e.enqueueRate = raw, fenced
	return []Result{ratioResult("enqueue", "intents/s", fenced, raw, 0.7,
		"baseline: BEGIN; INSERT; COMMIT of the same row")}, nil
}

// enqueueAgainstRaw measures, on an emptied outbox, the raw insert's rate
// and Enqueue's with cfg, alternated.
func (e *benchEnv) enqueueAgainstRaw(ctx context.Context, cfg outbox.Config) (raw, enqueue float64, err error) {
	ob, stop, err := e.freshEnqueuer(ctx, cfg)
	if err != nil {
		return 0, 0, err
	}
	defer stop()
	return alternate(e.d,
		func(d time.Duration) (float64, error) { return e.rawInsertRateFor(ctx, d) },
		func(d time.Duration) (float64, error) { return e.enqueueRateFor(ctx, ob, d) })
}

// caseBatch: EnqueueBatch of 100 intents against CopyFrom of the same 100
// rows, 4 workers.
func (e *benchEnv) caseBatch(ctx context.Context) ([]Result, error) {
	ob, stop, err := e.freshEnqueuer(ctx, outbox.Config{})
	if err != nil {
		return nil, err
	}
	defer stop()
	cols := []string{"resource_id", "epoch", "operation_id", "kind", "idempotency_key", "fence", "payload"}
	raw, batch, err := alternate(e.d,
		func(d time.Duration) (float64, error) {
			return measure(ctx, d, benchBatchWorkers, func(ctx context.Context, _ int, rnd *uint64) (int, error) {
				rows := make([][]any, benchBatchSize)
				for i := range rows {
					*rnd = *rnd*6364136223846793005 + 1442695040888963407
					in := e.intent(*rnd >> 16)
					rows[i] = []any{in.Resource, in.Epoch, in.OperationID, in.Kind, in.Resource + "/" + in.OperationID, "execute", string(in.Payload)}
				}
				_, err := e.pool.CopyFrom(ctx, pgx.Identifier{e.schema.Name(), "intents"}, cols, pgx.CopyFromRows(rows))
				return benchBatchSize, err
			})
		},
		func(d time.Duration) (float64, error) {
			return measure(ctx, d, benchBatchWorkers, func(ctx context.Context, _ int, rnd *uint64) (int, error) {
				batch := make([]outbox.Intent, benchBatchSize)
				for i := range batch {
					*rnd = *rnd*6364136223846793005 + 1442695040888963407
					batch[i] = e.intent(*rnd >> 16)
				}
				res, err := ob.EnqueueBatch(ctx, batch)
				if err != nil {
					return 0, err
				}
				for _, r := range res {
					if r.Err != nil {
						return 0, r.Err
					}
				}
				return benchBatchSize, nil
			})
		})
	if err != nil {
		return nil, err
	}
	return []Result{ratioResult("enqueue-batch", "intents/s", batch, raw, 0.5,
		fmt.Sprintf("batches of %d, %d workers; baseline: CopyFrom of the same rows", benchBatchSize, benchBatchWorkers))}, nil
}

// caseGroup: Enqueue with group commit, 16 workers, against case enqueue's
// raw rate (one row per transaction).
func (e *benchEnv) caseGroup(ctx context.Context) ([]Result, error) {
	raw, group, err := e.enqueueAgainstRaw(ctx, outbox.Config{GroupCommit: true, GroupFlushers: benchGroupFlushers})
	if err != nil {
		return nil, err
	}
	return []Result{ratioResult("enqueue-group", "intents/s", group, raw, 2.0,
		"group commit; baseline: BEGIN; INSERT; COMMIT of one row, as case enqueue")}, nil
}

// backlog loads n intents made by mk, with the given status, with COPY.
func (e *benchEnv) backlog(ctx context.Context, n int, status string, mk func(uint64) outbox.Intent) error {
	const chunk = 50_000
	cols := []string{"resource_id", "epoch", "operation_id", "kind", "idempotency_key", "fence", "payload", "status", "completed_at"}
	var completed any
	if status != "pending" {
		completed = time.Now()
	}
	for done := 0; done < n; {
		m := min(chunk, n-done)
		rows := make([][]any, m)
		for i := range rows {
			in := mk(uint64(done + i))
			rows[i] = []any{in.Resource, in.Epoch, in.OperationID, in.Kind, in.Resource + "/" + in.OperationID,
				string(cmp.Or(in.Fence, outbox.FenceExecute)), string(in.Payload), status, completed}
		}
		if _, err := e.pool.CopyFrom(ctx, pgx.Identifier{e.schema.Name(), "intents"}, cols, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("load intents: %w", err)
		}
		done += m
	}
	if _, err := e.pool.Exec(ctx, e.schema.SQL(`VACUUM ANALYZE fencegate.intents`)); err != nil {
		return err
	}
	if n >= 100_000 {
		// A large preload writes hundreds of MB of WAL, which triggers a
		// checkpoint (max_wal_size) that would otherwise land in the
		// measurement after it, with the full-page images of every page
		// first written after it: a benchmark artifact, not the product's.
		// Not allowed to a role without the privilege: then measured as is.
		if _, err := e.pool.Exec(ctx, e.schema.SQL(`CHECKPOINT`)); err != nil {
			fmt.Fprintf(e.log, "gateway bench: CHECKPOINT after the preload: %v (measuring anyway)\n", err)
		}
	}
	return nil
}

func (e *benchEnv) connectNATS() (*nats.Conn, error) {
	return nats.Connect(e.natsURL, nats.Name("fencegate-bench"))
}

// caseRelay: the dispatcher draining a backlog of pending intents, against
// raw JetStream async publishing of the same number of messages (same
// size, headers and message ids), same window.
func (e *benchEnv) caseRelay(ctx context.Context) ([]Result, error) {
	n := max(1000, int(e.d.Seconds()*benchRelayPerSec))
	nc, err := e.connectNATS()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(dispatcher.DefaultMaxInFlight))
	if err != nil {
		return nil, err
	}
	if _, err := js.CreateOrUpdateStream(ctx, dispatcher.Config{}.StreamConfig()); err != nil {
		return nil, err
	}
	var relayRate, rawRate float64
	for round := range 2 {
		if err := e.reset(ctx); err != nil {
			return nil, err
		}
		if err := e.backlog(ctx, n, "pending", e.intent); err != nil {
			return nil, err
		}
		d, err := dispatcher.New(e.pool, nc, dispatcher.Config{Schema: e.schema.Name(), DisableListen: true, PollInterval: 10 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		start := time.Now()
		if err := d.Start(ctx); err != nil {
			return nil, err
		}
		for {
			// Done when nothing is pending: the dispatcher marks an intent
			// relayed and clears its claim in one statement, so no pending
			// row means every intent is relayed and unclaimed. (Until issue
			// 7 this also asked "OR claimed_by IS NOT NULL": claimed_by has
			// no index, so every poll, every 2 ms, scanned the table and
			// took CPU from the dispatcher it measured.)
			var left bool
			if err := e.pool.QueryRow(ctx, e.schema.SQL(`SELECT EXISTS (SELECT 1 FROM fencegate.intents WHERE status = 'pending')`)).Scan(&left); err != nil {
				d.Stop()
				return nil, err
			}
			if !left {
				break
			}
			if time.Since(start) > 10*time.Minute {
				d.Stop()
				return nil, errors.New("relay did not drain the backlog in 10 minutes")
			}
			time.Sleep(2 * time.Millisecond)
		}
		relayRate += float64(n) / time.Since(start).Seconds() / 2
		d.Stop()

		start = time.Now()
		body := e.payload
		for i := range n {
			id := int64(1_000_000_000) + int64(round*n+i)
			m := nats.NewMsg(wire.Namespace("").Subject("raw")) // the dispatcher above runs without a namespace
			m.Data = body
			m.Header.Set(jetstream.MsgIDHeader, wire.Namespace("").MsgID(id, 1))
			m.Header.Set(wire.HeaderIntentID, strconv.FormatInt(id, 10))
			m.Header.Set(wire.HeaderResource, "bench-1")
			m.Header.Set(wire.HeaderEpoch, "1")
			m.Header.Set(wire.HeaderKind, "file")
			m.Header.Set(wire.HeaderIdempotencyKey, "bench-1/op-"+strconv.FormatInt(id, 10))
			m.Header.Set(wire.HeaderFence, "execute")
			m.Header.Set(wire.HeaderRelay, "1")
			if _, err := js.PublishMsgAsync(m); err != nil {
				return nil, err
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			return nil, errors.New("raw publish: PubAcks did not complete")
		}
		rawRate += float64(n) / time.Since(start).Seconds() / 2
	}
	return []Result{ratioResult("relay", "intents/s", relayRate, rawRate, 0.7,
		fmt.Sprintf("backlog of %d; baseline: JetStream async publish of the same messages", n))}, nil
}

// NoopExecutor is the benchmark's adapter: it succeeds at once, so e2e
// measures fencegate, not a destination.
type NoopExecutor struct{}

// Kind is "noop", a kind only the bench enqueues.
func (NoopExecutor) Kind() string { return "noop" }

// Capabilities are none: no result lookup, no dedup at the destination.
func (NoopExecutor) Capabilities() adapters.Capabilities { return adapters.Capabilities{} }

// Execute succeeds at once with an empty result.
func (NoopExecutor) Execute(context.Context, adapters.Request) (adapters.Outcome, error) {
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: json.RawMessage(`{}`)}, nil
}

var _ adapters.Executor = NoopExecutor{}

// NoopRegistration registers the no-op adapter: any JSON object is a
// payload, fenced at commit.
func NoopRegistration() adapters.Registration {
	return adapters.Registration{Kind: NoopExecutor{}.Kind(), Spec: outbox.KindSpec{DefaultFence: outbox.FenceCommit}, Executor: NoopExecutor{}}
}

// pipeline is a running `gateway run` (as shipped, with the no-op adapter)
// and outbox clients that enqueue noop intents, as workers would: ob one
// transaction per intent, group with group commit (Config.GroupCommit).
type pipeline struct {
	ob, group *outbox.Client
	run       *gatewayRun
	stop      func() error
}

func (e *benchEnv) startPipeline(ctx context.Context) (*pipeline, error) {
	kinds := outbox.DefaultKinds()
	kinds["noop"] = outbox.KindSpec{DefaultFence: outbox.FenceCommit}
	ob, err := outbox.New(e.pool, outbox.Config{Schema: e.schema.Name(), Kinds: kinds})
	if err != nil {
		return nil, err
	}
	group, err := outbox.New(e.pool, outbox.Config{Schema: e.schema.Name(), Kinds: kinds,
		GroupCommit: true, GroupFlushers: benchGroupFlushers})
	if err != nil {
		return nil, err
	}
	g, err := e.runGateway(ctx, true)
	if err != nil {
		return nil, err
	}
	return &pipeline{ob: ob, group: group, run: g, stop: g.stop}, nil
}

func (e *benchEnv) noopIntent(rnd uint64) outbox.Intent {
	in := e.intent(rnd)
	in.Kind, in.Fence = "noop", outbox.FenceCommit
	in.Payload = json.RawMessage(`{"bench":"` + strings.Repeat("x", benchPayloadBytes-12) + `"}`)
	return in
}

// window is what a max-rate measurement saw, on PostgreSQL's clock: it
// enqueued from start to end, n intents, inWindow of which had settled by
// end, the first at first and the last (after end, once they all had) at
// last.
type window struct {
	start, end, first, last time.Time
	n, inWindow             int64
}

// sustainedRate is the rate at which outcomes were recorded while the
// enqueuers ran: those settled in the window, from the first one on. The
// window's opening, before its first intent could have come through the
// pipeline (one end-to-end latency), is not counted as a pause: counting it
// made the rate 0 whenever the latency was longer than the window (seen on
// a loaded machine with the test's 400 ms window). When fewer than two
// settled in the window, the latency was longer than it: then all of the
// window's intents over the time until the last one settled.
func (w window) sustainedRate() float64 {
	if w.inWindow >= 2 && w.end.After(w.first) {
		return float64(w.inWindow) / w.end.Sub(w.first).Seconds()
	}
	if w.n == 0 || !w.last.After(w.start) {
		return 0
	}
	return float64(w.n) / w.last.Sub(w.start).Seconds()
}

// caseE2E: commit → recorded outcome through the dispatcher, NATS and the
// no-op adapter. Latency at an offered 500 intents/s (from the moment
// Enqueue returned, i.e. committed, to the outcome's completed_at), then
// the highest rate sustained end to end with 16 workers enqueueing flat out
// with group commit (outcomes recorded per second during the run:
// window.sustainedRate).
func (e *benchEnv) caseE2E(ctx context.Context, prefix string) ([]Result, error) {
	if prefix == "e2e" {
		if err := e.reset(ctx); err != nil {
			return nil, err
		}
	}
	p, err := e.startPipeline(ctx)
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = p.stop()
		}
	}()

	// The offered load starts once the pipeline has settled a first
	// intent from each sender at once: the pipeline's start (its pool
	// dialling its connections, its consumers' first pulls) took 0.6-1.1 s
	// to a first outcome on the bench's own server, and the senders' first
	// enqueues (each a connection of their own, its statements prepared)
	// fell behind the schedule and then caught up in a burst; a load
	// offered meanwhile queued behind both and made p99 the start-up's,
	// not the steady state's (docs/performance.md). How long it took is in
	// the note.
	begun := time.Now()
	firsts := make([]int64, benchWorkers)
	var warmErr atomic.Value
	var warmWG sync.WaitGroup
	for w := range benchWorkers {
		warmWG.Go(func() {
			res, err := p.ob.Enqueue(ctx, e.noopIntent(uint64(w)))
			if err != nil {
				warmErr.Store(err)
				return
			}
			firsts[w] = res.IntentID
		})
	}
	warmWG.Wait()
	if err, _ := warmErr.Load().(error); err != nil {
		return nil, err
	}
	if err := e.waitDone(ctx, e.pool, "e2e first outcomes", `completed_at IS NULL`, slices.Min(firsts), slices.Max(firsts), time.Now().Add(time.Minute)); err != nil {
		return nil, err
	}
	startup := time.Since(begun)

	// Offered load: intent i leaves at start + i/rate, from 16 senders so a
	// slow commit does not hold the schedule back. The first warm of it
	// is not measured either: the pipeline's batches and pools settle to
	// the rate.
	warm := min(benchE2EWarmup, e.d)
	skip := int(warm.Seconds() * benchE2ERate)
	total := skip + int(e.d.Seconds()*benchE2ERate)
	type sent struct {
		id int64
		at time.Time
	}
	sentc := make(chan sent, total-skip)
	jobs := make(chan int)
	var wg sync.WaitGroup
	var sendErr atomic.Value
	for w := range benchWorkers {
		wg.Go(func() {
			for i := range jobs {
				res, err := p.ob.Enqueue(ctx, e.noopIntent(uint64(i*benchWorkers+w)))
				if err != nil {
					sendErr.Store(err)
					continue
				}
				if i >= skip {
					sentc <- sent{res.IntentID, time.Now()}
				}
			}
		})
	}
	start := time.Now()
	for i := range total {
		if wait := time.Until(start.Add(time.Duration(i) * time.Second / benchE2ERate)); wait > 0 {
			time.Sleep(wait)
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(sentc)
	if err, _ := sendErr.Load().(error); err != nil {
		return nil, err
	}
	committed := map[int64]time.Time{}
	ids := make([]int64, 0, total)
	for s := range sentc {
		committed[s.id] = s.at
		ids = append(ids, s.id)
	}
	var lat []float64
	deadline := time.Now().Add(time.Minute)
	for len(lat) < len(ids) {
		lat = lat[:0]
		rows, err := e.pool.Query(ctx, e.schema.SQL(`SELECT intent_id, completed_at FROM fencegate.intents WHERE intent_id = ANY($1) AND completed_at IS NOT NULL`), ids)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id int64
			var at time.Time
			if err := rows.Scan(&id, &at); err != nil {
				return nil, err
			}
			lat = append(lat, float64(at.Sub(committed[id]))/float64(time.Millisecond))
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if len(lat) < len(ids) {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("only %d of %d intents completed within a minute", len(lat), len(ids))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	slices.Sort(lat)
	p50, p99 := percentile(lat, 0.50), percentile(lat, 0.99)

	// Max sustained: enqueue flat out, count outcomes recorded meanwhile
	// (sustainedRate). Reported is the lower of the two rates: what enters
	// and what comes out, so a growing backlog does not count as sustained.
	// The enqueuers use group commit, as a producer after throughput
	// would: with a transaction per intent they spent more of the shared
	// cores on their own commits and offered 1,100-1,600 /s on the 2-core
	// machine (1,600-2,000 /s with group commit); in both the pipeline kept
	// up (completed within 2 % of enqueued).
	//
	// Only intents above the highest id before the run are counted, through
	// the primary key: counting every completed intent would be a
	// sequential scan of the million preloaded rows in case growth (a
	// benchmark artifact, twice per run, on the machine being measured).
	var floor int64
	var mstart, mend time.Time // PostgreSQL's clock, as completed_at
	if err := e.pool.QueryRow(ctx, e.schema.SQL(`SELECT coalesce(max(intent_id), 0), clock_timestamp() FROM fencegate.intents`)).Scan(&floor, &mstart); err != nil {
		return nil, err
	}
	in, err := measure(ctx, e.d, benchWorkers, func(ctx context.Context, _ int, rnd *uint64) (int, error) {
		_, err := p.group.Enqueue(ctx, e.noopIntent(*rnd))
		return 1, err
	})
	if err != nil {
		return nil, err
	}
	var hi int64
	if err := e.pool.QueryRow(ctx, e.schema.SQL(`SELECT coalesce(max(intent_id), 0), clock_timestamp() FROM fencegate.intents`)).Scan(&hi, &mend); err != nil {
		return nil, err
	}
	// Wait for the window's intents (bounded), then read when they settled.
	if err := e.waitDone(ctx, e.pool, "e2e max rate", `completed_at IS NULL`, floor+1, hi, time.Now().Add(time.Minute)); err != nil {
		return nil, err
	}
	var w window
	w.start, w.end = mstart, mend
	if err := e.pool.QueryRow(ctx, e.schema.SQL(`SELECT count(*), count(*) FILTER (WHERE completed_at <= $2),
		coalesce(min(completed_at), $2), coalesce(max(completed_at), $2)
		FROM fencegate.intents WHERE intent_id > $1`), floor, mend).Scan(&w.n, &w.inWindow, &w.first, &w.last); err != nil {
		return nil, err
	}
	out := w.sustainedRate()
	maxRate := math.Min(in, out)

	stopped = true
	if err := p.stop(); err != nil {
		return nil, err
	}
	shipped := fmt.Sprintf("gateway run as shipped, the no-op adapter in place of email,file (db_max_conns=%d)", p.run.maxConns)
	if prefix == "e2e" {
		e.e2eP50, e.e2eMaxRate = p50, maxRate
		note := fmt.Sprintf("offered %d/s for %s after %s at the same rate, once the pipeline had settled a first intent from each sender (%s after its start); commit → outcome recorded; %s",
			benchE2ERate, e.d, warm, startup.Round(time.Millisecond), shipped)
		return []Result{
			{Name: "e2e-p50", Unit: "ms", Value: p50, Goal: "< 10", Met: p50 < 10, Note: note},
			{Name: "e2e-p99", Unit: "ms", Value: p99, Goal: "< 50", Met: p99 < 50, Note: note},
			{Name: "e2e-max-rate", Unit: "intents/s", Value: maxRate, Baseline: e.rawInsertRate,
				Ratio: ratioOf(maxRate, e.rawInsertRate), Goal: "report", Met: true,
				Note: fmt.Sprintf("enqueued %.0f/s, completed %.0f/s; baseline: case enqueue's raw insert rate; %s", in, out, shipped)},
		}, nil
	}
	return []Result{
		{Name: prefix + "-p50", Unit: "ms", Value: p50, Baseline: e.e2eP50, Ratio: ratioOf(p50, e.e2eP50),
			Goal: "ratio <= 1.1", Met: e.e2eP50 > 0 && p50 <= 1.1*e.e2eP50, Note: "baseline: e2e-p50 on an empty outbox"},
		{Name: prefix + "-p99", Unit: "ms", Value: p99, Goal: "< 50", Met: p99 < 50},
		{Name: prefix + "-max-rate", Unit: "intents/s", Value: maxRate, Baseline: e.e2eMaxRate, Ratio: ratioOf(maxRate, e.e2eMaxRate),
			Goal: "ratio >= 0.9", Met: ratioOf(maxRate, e.e2eMaxRate) >= 0.9, Note: "baseline: e2e-max-rate on an empty outbox"},
	}, nil
}

func ratioOf(v, base float64) float64 {
	if base == 0 {
		return 0
	}
	return v / base
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// caseGrowth: cases enqueue and e2e again with 1,000,000 completed intents
// in the outbox, against their values on an empty one (measured first when
// not in this run).
func (e *benchEnv) caseGrowth(ctx context.Context) ([]Result, error) {
	if e.enqueueRate == 0 {
		if _, err := e.caseEnqueue(ctx); err != nil {
			return nil, err
		}
	}
	if e.e2eP50 == 0 {
		if _, err := e.caseE2E(ctx, "e2e"); err != nil {
			return nil, err
		}
	}
	if err := e.reset(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "gateway bench: loading %d completed intents…\n", benchGrowthRows)
	lstart := time.Now()
	if err := e.backlog(ctx, benchGrowthRows, "succeeded", e.intent); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "gateway bench: loaded in %s\n", time.Since(lstart).Round(time.Second))
	ob, stop, err := e.enqueuer(ctx, outbox.Config{})
	if err != nil {
		return nil, err
	}
	rate, err := e.enqueueRateFor(ctx, ob, e.d)
	stop()
	if err != nil {
		return nil, err
	}
	out := []Result{ratioResult("growth-enqueue", "intents/s", rate, e.enqueueRate, 0.9,
		"1M completed intents preloaded; baseline: case enqueue on an empty outbox")}
	// The enqueue measurement leaves its intents pending (~20,000 at 4,000/s
	// for 5 s): the e2e rows below would start with that backlog to relay
	// and time it, not the pipeline (it put growth-e2e-p99 at ~1.4 s).
	// Removed; the million completed intents stay.
	if _, err := e.pool.Exec(ctx, e.schema.SQL(`DELETE FROM fencegate.intents WHERE status = 'pending'`)); err != nil {
		return nil, err
	}
	if _, err := e.pool.Exec(ctx, e.schema.SQL(`VACUUM ANALYZE fencegate.intents`)); err != nil {
		return nil, err
	}
	rs, err := e.caseE2E(ctx, "growth-e2e")
	if err != nil {
		return nil, err
	}
	return append(out, rs...), nil
}

// peakRSSMB is the process's peak resident set (VmHWM), in MiB; it
// includes the embedded NATS server when one runs.
func peakRSSMB() float64 {
	kb := procField("/proc/self/status", "VmHWM:")
	return float64(kb) / 1024
}

func memTotalMB() int64 { return procField("/proc/meminfo", "MemTotal:") / 1024 }

// procField reads a "Name:   123 kB" line of a /proc file.
func procField(path, name string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name); ok {
			fields := strings.Fields(rest)
			if len(fields) > 0 {
				n, _ := strconv.ParseInt(fields[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}
