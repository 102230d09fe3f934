package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/gateway"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/devsmtp"
	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/pgcluster"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/migrations"
	"github.com/fencegate/fencegate/outbox"
)

// Defaults of `gateway dev`.
const (
	devDefaultAddr     = "127.0.0.1:8080"
	devDefaultFileRoot = "var/files"
	devDatabase        = "fencegate"
	// devStartTimeout bounds starting everything (initdb included).
	devStartTimeout = 2 * time.Minute
)

// devReady is the JSON object `gateway dev` writes on stdout once every
// service is up.
type devReady struct {
	AdminURL    string `json:"admin_url"`
	NATSURL     string `json:"nats_url"`
	DatabaseURL string `json:"database_url"`
	SMTPAddr    string `json:"smtp_addr"`
	FileRoot    string `json:"file_root"`
	// MailpitURL is set when mail goes to Mailpit instead of the built-in
	// sink.
	MailpitURL string `json:"mailpit_url,omitempty"`
	// DataDir holds the PostgreSQL cluster and the NATS store; empty when
	// both are external.
	DataDir string `json:"data_dir,omitempty"`
	// DataDirKept is false when DataDir is removed on exit.
	DataDirKept bool `json:"data_dir_kept"`
	// PostgresPID is the throwaway PostgreSQL's process id; 0 with
	// --database-url.
	PostgresPID int `json:"postgres_pid,omitempty"`
	// Demo reports whether the demo scenario runs.
	Demo bool `json:"demo"`
}

// cmdDev runs the whole system in one process (gateway dev), like
// `temporal server start-dev`: a throwaway PostgreSQL (or --database-url),
// an embedded NATS JetStream server (or --nats-url), an SMTP sink with
// result lookup (or Mailpit), a file root, the dispatcher, both adapters and
// the admin server, until SIGINT/SIGTERM. It prints the URLs on stderr and
// one JSON object (devReady) on stdout once ready. --demo then replays the
// article's scenario in-process. On a signal everything stops in reverse
// order: nothing keeps running and the temporary data directory is removed.
//
// Flags: --addr (admin, default 127.0.0.1:8080); --data-dir (keep the
// PostgreSQL cluster and NATS store there and reuse them next time;
// default: a temporary directory removed on exit); --database-url and
// --nats-url use existing servers instead (the environment's
// GATEWAY_DATABASE_URL and GATEWAY_NATS_URL are deliberately ignored, so
// dev never touches a configured server by accident); --nats-port (embedded
// NATS port, default free); --smtp-addr (the sink's listen address, default
// a free port; with --mailpit-url, Mailpit's SMTP address, default
// 127.0.0.1:1025); --mailpit-url (send mail to Mailpit and look results up
// there); --file-root (default ./var/files); --demo; --log-level.
func cmdDev(ctx context.Context, a *app, args []string) int {
	fs := flag.NewFlagSet("gateway dev", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o devOptions
	fs.StringVar(&o.addr, "addr", devDefaultAddr, "admin server address (loopback)")
	fs.StringVar(&o.dataDir, "data-dir", "", "keep PostgreSQL's cluster and the NATS store here and reuse them (default: a temporary directory removed on exit)")
	fs.StringVar(&o.databaseURL, "database-url", "", "use this PostgreSQL instead of starting one ($GATEWAY_DATABASE_URL is ignored)")
	fs.StringVar(&o.natsURL, "nats-url", "", "use this NATS server instead of starting one ($GATEWAY_NATS_URL is ignored)")
	fs.IntVar(&o.natsPort, "nats-port", 0, "port of the embedded NATS server on 127.0.0.1 (default: a free port)")
	fs.StringVar(&o.smtpAddr, "smtp-addr", "", "SMTP sink listen address (default 127.0.0.1 and a free port); with --mailpit-url, Mailpit's SMTP address (default 127.0.0.1:1025)")
	fs.StringVar(&o.mailpitURL, "mailpit-url", "", "send mail to Mailpit and look results up through its API, e.g. http://127.0.0.1:8025 (default: the built-in sink)")
	fs.StringVar(&o.fileRoot, "file-root", devDefaultFileRoot, "directory the file adapter publishes under")
	fs.BoolVar(&o.demo, "demo", false, "replay the article's scenario: worker A pauses past its lease, B takes over, A's late write is fenced out")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", "text", "log format on stderr: text or json (slog)")
	allowFsyncOff := a.fsyncFlag(fs)
	if code, ok := a.parseWithEnv(fs, args, "database-url", "nats-url"); !ok {
		return code
	}
	o.allowFsyncOff = *allowFsyncOff
	if err := noArgs(fs); err != nil {
		return a.fail(err)
	}
	if err := o.validate(); err != nil {
		return a.fail(err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return a.fail(badInput("log_level", "--log-level must be debug, info, warn or error"))
	}
	logger, err := newLogger(a.stderr, level, *logFormat)
	if err != nil {
		return a.fail(err)
	}

	d := &devEnv{a: a, opts: o, log: logger}
	began := time.Now()
	sctx, cancel := context.WithTimeout(ctx, devStartTimeout)
	ready, err := d.start(sctx)
	cancel()
	if err != nil {
		d.stopAll()
		if ctx.Err() != nil {
			// Interrupted while starting: not a failure.
			logger.Info("gateway dev: interrupted while starting; stopped", "component", "dev")
			return exitOK
		}
		return a.fail(err)
	}
	d.printReady(ready, time.Since(began))

	demoDone := make(chan struct{})
	demoCtx, stopDemo := context.WithCancel(ctx)
	if o.demo {
		go func() {
			defer close(demoDone)
			if err := d.runDemo(demoCtx); err != nil && demoCtx.Err() == nil {
				logger.Error("demo: failed", "component", "demo", "error", err)
			}
		}()
	} else {
		close(demoDone)
	}

	code := exitOK
	select {
	case <-ctx.Done():
		logger.Info("gateway dev: stopping", "component", "dev")
	case <-d.stack.Stopped():
		logger.Error("gateway dev: a component stopped unexpectedly; stopping everything", "component", "dev", "part", d.stack.Cause())
		code = exitInternal
	}
	stopDemo()
	<-demoDone

	done := make(chan struct{})
	go func() { d.stopAll(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopTimeout):
		logger.Error("gateway dev: components did not stop in time", "component", "dev", "timeout", stopTimeout)
		return exitInternal
	}
	logger.Info("gateway dev: stopped", "component", "dev")
	return code
}

// devOptions are the parsed flags of `gateway dev`.
type devOptions struct {
	addr        string
	dataDir     string
	databaseURL string
	natsURL     string
	natsPort    int
	smtpAddr    string
	mailpitURL  string
	fileRoot    string
	demo        bool
	logLevel    string
	// allowFsyncOff lets --database-url name a server with fsync=off.
	allowFsyncOff bool
}

func (o *devOptions) validate() error {
	host, _, err := net.SplitHostPort(o.addr)
	if err != nil || host == "" {
		return badInput("addr", fmt.Sprintf("--addr must be host:port, got %q", o.addr))
	}
	// Dev configures no API tokens, so the admin server must not be
	// reachable from other machines.
	if ip, err := netip.ParseAddr(host); host != "localhost" && (err != nil || !ip.Unmap().IsLoopback()) {
		return badInput("addr", fmt.Sprintf("--addr must be a loopback address (dev serves the admin API without tokens), got %q", o.addr))
	}
	if o.natsPort < 0 || o.natsPort > 65535 {
		return badInput("nats_port", "--nats-port must be between 0 and 65535")
	}
	if o.natsPort != 0 && o.natsURL != "" {
		return badInput("nats_port", "--nats-port and --nats-url exclude each other")
	}
	if o.smtpAddr != "" {
		if _, _, err := net.SplitHostPort(o.smtpAddr); err != nil {
			return badInput("smtp_addr", fmt.Sprintf("--smtp-addr must be host:port, got %q", o.smtpAddr))
		}
	}
	if o.mailpitURL != "" {
		u, err := url.Parse(o.mailpitURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return badInput("mailpit_url", "--mailpit-url must be an http:// or https:// URL, e.g. http://127.0.0.1:8025")
		}
	}
	if o.fileRoot == "" {
		return badInput("file_root", "--file-root must not be empty")
	}
	return nil
}

// devEnv is what `gateway dev` started, in start order; stopAll stops it
// in reverse.
type devEnv struct {
	a    *app
	opts devOptions
	log  *slog.Logger

	parts []devPart

	dataDir  string
	pg       *pgcluster.Cluster // nil with --database-url
	dbURL    string
	pool     *pgxpool.Pool
	natsSrv  *natsserver.Server // nil with --nats-url
	natsURL  string
	sink     *devsmtp.Server // nil with --mailpit-url
	smtpAddr string
	fileRoot string
	stack    *gateway.Gateway
	adminLn  net.Listener
	adminURL string
}

// devPart is one started service.
type devPart struct {
	name string
	stop func()
}

func (d *devEnv) add(name string, stop func()) { d.parts = append(d.parts, devPart{name, stop}) }

// stopAll stops every started part in reverse order. Safe to call twice.
func (d *devEnv) stopAll() {
	for i := len(d.parts) - 1; i >= 0; i-- {
		p := d.parts[i]
		d.log.Debug("gateway dev: stopping "+p.name, "component", "dev")
		p.stop()
	}
	d.parts = nil
}

// start brings every service up in dependency order: data directory,
// PostgreSQL (and migrations), NATS, the SMTP sink, the file root, the
// relay and adapters, and the admin server.
func (d *devEnv) start(ctx context.Context) (devReady, error) {
	// The admin address is taken first, so a port in use fails at once
	// instead of after PostgreSQL started.
	ln, err := net.Listen("tcp", d.opts.addr)
	if err != nil {
		return devReady{}, badInput("addr", "cannot listen on --addr (is another gateway dev running?): "+oneLine(err.Error()))
	}
	d.adminLn = ln
	d.add("admin listener", func() { _ = ln.Close() })
	if err := d.startDataDir(); err != nil {
		return devReady{}, err
	}
	var root string
	if err := d.startPostgres(ctx); err != nil {
		return devReady{}, err
	}
	if err := d.startNATS(); err != nil {
		return devReady{}, err
	}
	if err := d.startMail(); err != nil {
		return devReady{}, err
	}
	root, err = filepath.Abs(d.opts.fileRoot)
	if err != nil {
		return devReady{}, badInput("file_root", "--file-root: "+err.Error())
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return devReady{}, badInput("file_root", "cannot create --file-root: "+oneLine(err.Error()))
	}
	d.fileRoot = root

	cfg := gateway.Config{
		Pool:          d.pool,
		NATSURL:       d.natsURL,
		RunDispatcher: true,
		Adapters:      []string{email.Kind, file.Kind},
		File:          file.Config{Root: root},
		Email:         email.Config{Addr: d.smtpAddr},
		Idempotency:   idempotency.Config{GroupCommit: true}, // as gateway run's default
		Logger:        d.log,
	}
	if d.sink != nil {
		// The sink offers no STARTTLS; saying so skips the probe.
		cfg.Email.StartTLS = email.StartTLSNone
		cfg.Email.Lookup = d.sink
	} else {
		cfg.MailLookup = mailLookupMailpit
		cfg.MailpitURL = d.opts.mailpitURL
	}
	s, err := gateway.Start(ctx, cfg)
	if err != nil {
		return devReady{}, err
	}
	d.stack = s
	d.add("relay and adapters", s.Stop)

	if err := d.startAdmin(); err != nil {
		return devReady{}, err
	}

	r := devReady{
		AdminURL: d.adminURL, NATSURL: d.natsURL, DatabaseURL: d.dbURL, SMTPAddr: d.smtpAddr,
		FileRoot: d.fileRoot, MailpitURL: d.opts.mailpitURL, DataDir: d.dataDir,
		DataDirKept: d.opts.dataDir != "", Demo: d.opts.demo,
	}
	if d.pg != nil {
		r.PostgresPID = d.pg.PID()
	}
	return r, nil
}

// startDataDir creates the directory for PostgreSQL's cluster and the NATS
// store, unless both are external.
func (d *devEnv) startDataDir() error {
	if d.opts.databaseURL != "" && d.opts.natsURL != "" {
		return nil
	}
	if d.opts.dataDir != "" {
		dir, err := filepath.Abs(d.opts.dataDir)
		if err != nil {
			return badInput("data_dir", "--data-dir: "+err.Error())
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return badInput("data_dir", "cannot create --data-dir: "+oneLine(err.Error()))
		}
		d.dataDir = dir
		return nil
	}
	dir, err := os.MkdirTemp("", "fencegate-dev-")
	if err != nil {
		return fmt.Errorf("create a temporary data directory: %w", err)
	}
	// When run as root, PostgreSQL runs as the postgres user (initdb
	// refuses root) and must be able to pass through this directory to
	// its own subdirectory; nobody else can list it.
	if err := os.Chmod(dir, 0o711); err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("chmod the temporary data directory: %w", err)
	}
	d.dataDir = dir
	// Added first, so it is removed last, after PostgreSQL and NATS
	// stopped writing into it.
	d.add("data directory", func() {
		if err := os.RemoveAll(dir); err != nil {
			d.log.Warn("gateway dev: cannot remove the data directory", "component", "dev", "dir", dir, "error", err)
		}
	})
	return nil
}

// startPostgres starts the throwaway cluster (or connects to
// --database-url), creates the fencegate database and applies the
// migrations.
func (d *devEnv) startPostgres(ctx context.Context) error {
	d.dbURL = d.opts.databaseURL
	if d.dbURL == "" {
		kept := d.opts.dataDir != ""
		c, err := pgcluster.Start(ctx, pgcluster.Options{
			Dir: filepath.Join(d.dataDir, "postgres"),
			// fsync on, throwaway or kept: dev shows the guarantee, and a
			// grant must survive a crash there too (the gateway refuses
			// fsync=off elsewhere).
			Durable: true,
		})
		if err != nil {
			hint := ""
			if os.Geteuid() == 0 && kept {
				hint = " (as root, PostgreSQL runs as the postgres user: every directory above --data-dir must be searchable by it)"
			}
			return unavailable("start PostgreSQL: " + oneLine(err.Error()) + hint)
		}
		d.pg = c
		d.add("PostgreSQL", func() {
			if err := c.Stop(); err != nil {
				d.log.Warn("gateway dev: PostgreSQL shutdown", "component", "dev", "error", err)
			}
		})
		if err := createDatabase(ctx, c.URL("postgres"), devDatabase); err != nil {
			return err
		}
		d.dbURL = c.URL(devDatabase)
	}
	pool, err := d.a.connect(ctx, d.dbURL)
	if err != nil {
		return err
	}
	d.pool = pool
	d.add("database pool", pool.Close)
	if err := d.a.requireFsync(ctx, pool, d.opts.allowFsyncOff); err != nil {
		return err
	}
	applied, err := migrations.Up(ctx, pool, nil)
	if err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	d.log.Info("gateway dev: database ready", "component", "dev", "migrations_applied", len(applied))
	return nil
}

// createDatabase creates db on the server behind adminURL unless it exists.
func createDatabase(ctx context.Context, adminURL, db string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, db).Scan(&exists); err != nil {
		return fmt.Errorf("look for database %s: %w", db, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", db, err)
	}
	return nil
}

// startNATS starts the embedded JetStream server (or uses --nats-url).
func (d *devEnv) startNATS() error {
	if d.opts.natsURL != "" {
		d.natsURL = d.opts.natsURL
		return nil
	}
	port := d.opts.natsPort
	if port == 0 {
		port = natsserver.RANDOM_PORT
	}
	srv, err := natsserver.NewServer(&natsserver.Options{
		ServerName: "fencegate-dev",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(d.dataDir, "nats"),
		NoLog:      true,
		NoSigs:     true, // signals are ours: ctx ends on SIGINT/SIGTERM
	})
	if err != nil {
		return badInput("nats_port", "embedded NATS: "+oneLine(err.Error()))
	}
	srv.Start()
	d.add("NATS", func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(10 * time.Second) {
		return unavailable(fmt.Sprintf("embedded NATS did not start on 127.0.0.1:%d (is the port in use?)", d.opts.natsPort))
	}
	if !srv.JetStreamEnabled() {
		return unavailable("embedded NATS started without JetStream")
	}
	d.natsSrv = srv
	d.natsURL = srv.ClientURL()
	return nil
}

// startMail starts the SMTP sink, or points at Mailpit.
func (d *devEnv) startMail() error {
	if d.opts.mailpitURL != "" {
		d.smtpAddr = d.opts.smtpAddr
		if d.smtpAddr == "" {
			d.smtpAddr = "127.0.0.1:1025"
		}
		return nil
	}
	sink, err := devsmtp.Start(devsmtp.Config{Addr: d.opts.smtpAddr, Logger: d.log})
	if err != nil {
		return badInput("smtp_addr", oneLine(err.Error()))
	}
	d.sink = sink
	d.smtpAddr = sink.Addr()
	d.add("SMTP sink", func() { _ = sink.Close() })
	return nil
}

// startAdmin serves the admin API (and, as they come, its pages) on the
// listener start took for --addr. This is the one place dev wires it.
//
// Dev configures no tokens: admin then serves without authentication, and
// validate allows loopback addresses only.
func (d *devEnv) startAdmin() error {
	issuer := lease.NewIssuer(d.pool)
	srv, err := admin.New(admin.Config{
		Pool:     d.pool,
		Outbox:   d.stack.Outbox(),
		Issuer:   issuer,
		Store:    d.stack.Store(),
		Registry: d.stack.Registry(),
		NATSReady: func() error {
			if !d.stack.NATS().IsConnected() {
				return fmt.Errorf("NATS %s", d.stack.NATS().Status())
			}
			return nil
		},
		Logger: d.log,
	})
	if err != nil {
		return err
	}
	ln := d.adminLn
	if err := srv.Start(context.Background(), ln); err != nil {
		return err
	}
	go func() {
		<-srv.Stopped()
		if err := srv.Err(); err != nil {
			d.log.Error("gateway dev: admin server", "component", "dev", "error", err)
		}
	}()
	d.adminURL = "http://" + ln.Addr().String()
	d.add("admin server", srv.Stop)
	return nil
}

// printReady writes the URLs for people on stderr and the JSON object on
// stdout.
func (d *devEnv) printReady(r devReady, took time.Duration) {
	w := d.a.stderr
	fmt.Fprintf(w, "\nfencegate dev is ready (%s)\n\n", took.Round(10*time.Millisecond))
	fmt.Fprintf(w, "  admin       %s\n", r.AdminURL)
	fmt.Fprintf(w, "  NATS        %s%s\n", r.NATSURL, devNote(d.natsSrv == nil, "existing server", "embedded, JetStream"))
	fmt.Fprintf(w, "  PostgreSQL  %s%s\n", redactURL(r.DatabaseURL), devNote(d.pg == nil, "existing server", "throwaway, pid "+strconv.Itoa(r.PostgresPID)))
	if d.sink != nil {
		fmt.Fprintf(w, "  SMTP        %s (in-memory sink with result lookup)\n", r.SMTPAddr)
	} else {
		fmt.Fprintf(w, "  SMTP        %s (Mailpit, lookup via %s)\n", r.SMTPAddr, r.MailpitURL)
	}
	fmt.Fprintf(w, "  file root   %s\n", r.FileRoot)
	switch {
	case r.DataDir == "":
	case r.DataDirKept:
		fmt.Fprintf(w, "  data dir    %s (kept)\n", r.DataDir)
	default:
		fmt.Fprintf(w, "  data dir    %s (removed on exit)\n", r.DataDir)
	}
	// The export line names only what dev started: an existing server's
	// URL may carry a password, and its owner knows it already.
	var exports []string
	if d.pg != nil {
		exports = append(exports, "GATEWAY_DATABASE_URL='"+r.DatabaseURL+"'")
	}
	if d.natsSrv != nil {
		exports = append(exports, "GATEWAY_NATS_URL='"+r.NATSURL+"'")
	}
	if len(exports) > 0 {
		fmt.Fprintf(w, "\n  export %s\n", strings.Join(exports, " "))
	}
	fmt.Fprintf(w, "\nPress Ctrl-C to stop.\n\n")
	d.a.writeJSON(r)
}

func devNote(ext bool, yes, no string) string {
	if ext {
		return " (" + yes + ")"
	}
	return " (" + no + ")"
}

// The demo's scenario (the article's): resource, workers, lease TTL, target.
const (
	demoResource = "nightly-report"
	demoHolderA  = "worker-A"
	demoHolderB  = "worker-B"
	demoTTL      = 2 * time.Second
	// demoPause is how long A pauses: past its lease, as in the article.
	demoPause  = demoTTL + time.Second
	demoTarget = "reports/nightly.txt"
	// demoWait bounds waiting for B's intents to finish.
	demoWait = time.Minute
)

// demoOpID is the operation id of a worker's write in the demo; epochs grow
// on every run against a kept database, so the ids never repeat.
func demoOpID(worker, what string, epoch int64) string {
	return fmt.Sprintf("%s-%s-epoch-%d", worker, what, epoch)
}

// runDemo replays the article's scenario with the real library calls,
// in-process: A takes a lease and pauses past it, B takes over and
// publishes through the outbox, dispatcher, NATS and the adapters, and A's
// late write is fenced out — by the outbox's epoch check and, had it got
// that far, by the file destination's own fence.
func (d *devEnv) runDemo(ctx context.Context) error {
	log := d.log.With("component", "demo")
	issuer := lease.NewIssuer(d.pool)
	ob, err := outbox.New(d.pool, outbox.Config{Logger: d.log})
	if err != nil {
		return err
	}
	log.Info(fmt.Sprintf("demo: the article's scenario on resource %q: worker A pauses past its lease, worker B takes over", demoResource))

	// 1. A takes the lease.
	la, err := demoAcquire(ctx, issuer, log, demoHolderA)
	if err != nil {
		return err
	}
	n := la.Epoch
	log.Info(fmt.Sprintf("demo: A took the lease: epoch %d, TTL %s", n, demoTTL), "worker", "A", "epoch", n)

	// 1b. While its lease is live, A commits the publication of its report
	// (fence commit: it was decided while epoch n was current). The write
	// is then held up in transit — a slow relay, a partitioned network —
	// which the demo stands in for by parking the intent under a claim of
	// a dispatcher that does not exist. It arrives after B's, below.
	aLateOp := demoOpID("A", "report-in-transit", n)
	aLateID, err := d.demoEnqueueParked(ctx, ob, outbox.Intent{
		Resource: demoResource, Epoch: n, OperationID: aLateOp, Kind: file.Kind, Fence: outbox.FenceCommit,
		Payload: demoJSON(map[string]any{"target": demoTarget, "content": fmt.Sprintf("report by A, epoch %d", n)}),
	})
	if err != nil {
		return fmt.Errorf("A's publication: %w", err)
	}
	log.Info(fmt.Sprintf("demo: A committed the publication of %s with epoch %d (intent %d) while its lease was live; the write is delayed in transit",
		demoTarget, n, aLateID), "worker", "A", "intent_id", aLateID)

	// 2. A pauses (a GC pause, a stalled VM): here the sleep is the
	// scenario. Its lease runs out meanwhile.
	pausedAt := time.Now()
	log.Info(fmt.Sprintf("demo: A pauses (GC pause, stalled VM) for %s before its next write; its %s lease runs out", demoPause, demoTTL), "worker", "A")

	// 3. B, waiting for the lease, gets it once A's has expired — by
	// PostgreSQL's clock — with the next epoch.
	lb, err := demoAcquire(ctx, issuer, log, demoHolderB)
	if err != nil {
		return err
	}
	m := lb.Epoch
	log.Info(fmt.Sprintf("demo: B took over: epoch %d (A still believes it holds epoch %d)", m, n), "worker", "B", "epoch", m)

	// 4. B publishes the report and emails it, both through the outbox.
	fileOp := demoOpID("B", "report", m)
	fres, err := ob.Enqueue(ctx, outbox.Intent{
		Resource: demoResource, Epoch: m, OperationID: fileOp, Kind: file.Kind,
		Payload: demoJSON(map[string]any{"target": demoTarget, "content": fmt.Sprintf("report by B, epoch %d", m)}),
	})
	if err != nil {
		return fmt.Errorf("B's file intent: %w", err)
	}
	log.Info(fmt.Sprintf("demo: B enqueued the publication of %s with epoch %d: intent %d", demoTarget, m, fres.IntentID),
		"worker", "B", "intent_id", fres.IntentID, "operation_id", fileOp)
	day := time.Now().UTC().Format("2006-01-02")
	mailOp := demoOpID("B", "email", m)
	mres, err := ob.Enqueue(ctx, outbox.Intent{
		Resource: demoResource, Epoch: m, OperationID: mailOp, Kind: email.Kind,
		// The business key: this day's report goes to alice once, whoever
		// sends it and however often the job runs (a second run against a
		// kept database records the first run's result and sends nothing).
		// Its content must therefore be the same for every sender: the
		// same key with other content is a conflict, never sent.
		IdempotencyKey: fmt.Sprintf("nightly-report/%s/alice@example.com", day),
		Payload: demoJSON(map[string]any{
			"to": "alice@example.com", "from": "reports@example.com",
			"subject": "Nightly report " + day,
			"text":    fmt.Sprintf("The nightly report for %s is published at %s.", day, demoTarget),
		}),
	})
	if err != nil {
		return fmt.Errorf("B's email intent: %w", err)
	}
	log.Info(fmt.Sprintf("demo: B enqueued the email to alice@example.com with epoch %d: intent %d", m, mres.IntentID),
		"worker", "B", "intent_id", mres.IntentID, "operation_id", mailOp)

	// 5. The dispatcher relays both through NATS; the adapters execute and
	// record the outcome in PostgreSQL.
	frec, err := demoAwait(ctx, ob, log, fres.IntentID)
	if err != nil {
		return err
	}
	if _, err := demoAwait(ctx, ob, log, mres.IntentID); err != nil {
		return err
	}
	if frec.Status == outbox.StatusSuperseded {
		log.Warn(fmt.Sprintf("demo: B's publication was superseded at the destination: %s already holds a newer epoch from an earlier run "+
			"against another database (epochs restarted with a fresh database); use an empty --file-root", demoTarget), "result", string(frec.Result))
	}

	// 6. A wakes up, still believing it holds the lease, and writes.
	if wait := demoPause - time.Since(pausedAt); wait > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	log.Info(fmt.Sprintf("demo: A wakes up after %s and writes its report with epoch %d, still believing it holds the lease",
		time.Since(pausedAt).Round(100*time.Millisecond), n), "worker", "A")
	aOp := demoOpID("A", "report", n)
	aPayload := demoJSON(map[string]any{"target": demoTarget, "content": fmt.Sprintf("report by A, epoch %d", n)})
	_, err = ob.Enqueue(ctx, outbox.Intent{Resource: demoResource, Epoch: n, OperationID: aOp, Kind: file.Kind, Payload: aPayload})
	var stale *outbox.StaleEpochError
	switch {
	case errors.As(err, &stale):
		log.Info(fmt.Sprintf("demo: A's write with epoch %d was rejected: current epoch is %d (StaleEpochError; nothing was stored)",
			stale.Supplied, stale.Current), "worker", "A", "operation_id", aOp)
	case err != nil:
		return fmt.Errorf("A's stale write: %w", err)
	default:
		return fmt.Errorf("A's stale write with epoch %d was accepted: the fence failed", n)
	}

	// 7. The destination's own fence: A's publication, committed with epoch
	// n before the pause, finally arrives — after B's epoch m was published.
	// It goes through the real relay and the file adapter, which compares
	// epochs under its lock at the destination and refuses it; the outcome
	// (superseded) is recorded on the intent, for the pages to show.
	if err := intents.Unpark(ctx, d.pool, aLateID); err != nil {
		return fmt.Errorf("release A's delayed publication: %w", err)
	}
	_, _ = d.pool.Exec(ctx, `SELECT pg_notify('fencegate_intents', '')`)
	lrec, err := demoAwait(ctx, ob, log, aLateID)
	if err != nil {
		return err
	}
	switch {
	case frec.Status == outbox.StatusSucceeded && lrec.Status == outbox.StatusSuperseded:
		log.Info(fmt.Sprintf("demo: A's delayed publication with epoch %d arrived late and was refused at the file destination: superseded, %s holds epoch %d",
			n, demoTarget, m), "worker", "A", "intent_id", aLateID, "result", string(lrec.Result))
	case frec.Status == outbox.StatusSucceeded:
		return fmt.Errorf("the file destination did not refuse A's stale publication: %s", lrec.Status)
	}

	// 8. What is published.
	if b, err := os.ReadFile(filepath.Join(d.fileRoot, filepath.FromSlash(demoTarget))); err == nil {
		log.Info(fmt.Sprintf("demo: %s contains %q", filepath.Join(d.fileRoot, filepath.FromSlash(demoTarget)), string(b)))
	}
	if d.sink != nil {
		log.Info(fmt.Sprintf("demo: the SMTP sink holds %d message(s)", len(d.sink.Messages())))
	}
	if err := issuer.Release(ctx, demoResource, demoHolderB, m); err != nil {
		log.Warn("demo: B could not release the lease", "error", err)
	}
	log.Info(fmt.Sprintf("demo: done. B's report (epoch %d) is published and mailed once; A's stale write (epoch %d) changed nothing. Browse %s; Ctrl-C to stop.",
		m, n, d.adminURL))
	return nil
}

// demoEnqueueParked enqueues in and, in the same transaction, parks it under
// a long claim of a dispatcher that does not exist, so no dispatcher relays
// it until the demo clears the claim.
func (d *devEnv) demoEnqueueParked(ctx context.Context, ob *outbox.Client, in outbox.Intent) (int64, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	res, err := ob.EnqueueTx(ctx, tx, in)
	if err != nil {
		return 0, err
	}
	if err := intents.Park(ctx, tx, res.IntentID, "demo: in transit", time.Hour); err != nil {
		return 0, err
	}
	return res.IntentID, tx.Commit(ctx)
}

// demoAcquire takes the demo resource's lease for holder, waiting while
// another holder's lease is live (as a worker polling for a job would).
func demoAcquire(ctx context.Context, issuer *lease.Issuer, log *slog.Logger, holder string) (lease.Lease, error) {
	logged := false
	for {
		l, err := issuer.Acquire(ctx, demoResource, holder, demoTTL)
		var held *lease.HeldError
		if !errors.As(err, &held) {
			if err != nil {
				return lease.Lease{}, fmt.Errorf("%s acquires the lease: %w", holder, err)
			}
			return l, nil
		}
		if !logged {
			log.Info(fmt.Sprintf("demo: %s asks for the lease: held by %s (epoch %d) until %s; waiting",
				holder, held.Holder, held.Epoch, held.ExpiresAt.Format("15:04:05.000")))
			logged = true
		}
		select {
		case <-ctx.Done():
			return lease.Lease{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// demoAwait polls an intent until it is terminal, logging each status.
func demoAwait(ctx context.Context, ob *outbox.Client, log *slog.Logger, id int64) (*outbox.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	var last outbox.Status
	for {
		rec, err := ob.Get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("intent %d: %w", id, err)
		}
		if rec.Status != last {
			last = rec.Status
			attrs := []any{"intent_id", id, "kind", rec.Kind, "status", rec.Status}
			if rec.Status.Terminal() {
				attrs = append(attrs, "result", string(rec.Result))
			}
			if rec.LastError != nil {
				attrs = append(attrs, "last_error", *rec.LastError)
			}
			log.Info(fmt.Sprintf("demo: intent %d (%s, epoch %d) is %s", id, rec.Kind, rec.Epoch, rec.Status), attrs...)
		}
		if rec.Status.Terminal() {
			return rec, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("intent %d still %s after %s", id, rec.Status, demoWait)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func demoJSON(v map[string]any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of strings always encode
	}
	return b
}
