// Package devenv is `gateway dev`: the whole system in one process, for a
// laptop — a throwaway PostgreSQL (or a given one), an embedded NATS
// JetStream server, an SMTP sink with result lookup (or Mailpit), a file
// root, the relay, both adapters and the admin server — and its demo, the
// article's scenario replayed in-process. The command line parses the flags
// into Options and calls Run.
package devenv

import (
	"context"
	"encoding/json"
	"errors"
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
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/cli/internal/devsmtp"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/gateway"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/migrations"
)

// Defaults of `gateway dev`.
const (
	DefaultAddr     = "127.0.0.1:8080"
	DefaultFileRoot = "var/files"
	devDatabase     = "fencegate"
	// devStartTimeout bounds starting everything (initdb included).
	devStartTimeout = 2 * time.Minute
)

// Ready is the JSON object `gateway dev` writes on stdout once every
// service is up.
type Ready struct {
	AdminURL    string `json:"admin_url"`
	NATSURL     string `json:"nats_url"`
	DatabaseURL string `json:"database_url"`
	SMTPAddr    string `json:"smtp_addr"`
	FileRoot    string `json:"file_root"`
	// WebhookURL is the built-in echo receiver, the one destination the
	// webhook adapter may call (GET /requests lists what it received).
	WebhookURL string `json:"webhook_url"`
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

// Run runs the whole system in one process (gateway dev) until ctx ends
// (SIGINT/SIGTERM) or a component stops. It prints the URLs on stderr and
// one JSON object (Ready) on stdout once ready; with Demo it then replays
// the article's scenario in-process. On the way out everything stops in
// reverse order: nothing keeps running and the temporary data directory is
// removed. o must have passed Validate.
//
// It returns an exit code, or an error to report (starting failed) once
// everything started is stopped again.
func Run(ctx context.Context, o Options) (int, error) {
	logger := o.Logger
	d := &devEnv{opts: o, log: logger}
	began := time.Now()
	sctx, cancel := context.WithTimeout(ctx, devStartTimeout)
	ready, err := d.start(sctx)
	cancel()
	if err != nil {
		d.stopAll()
		if ctx.Err() != nil {
			// Interrupted while starting: not a failure.
			logger.Info("gateway dev: interrupted while starting; stopped", "component", "dev")
			return errmap.ExitOK, nil
		}
		return 0, err
	}
	d.printReady(ready, time.Since(began))

	demoDone := make(chan struct{})
	demoCtx, stopDemo := context.WithCancel(ctx)
	if o.Demo {
		go func() {
			defer close(demoDone)
			if err := d.runDemo(demoCtx); err != nil && demoCtx.Err() == nil {
				logger.Error("demo: failed", "component", "demo", "error", err)
			}
		}()
	} else {
		close(demoDone)
	}

	code := errmap.ExitOK
	select {
	case <-ctx.Done():
		logger.Info("gateway dev: stopping", "component", "dev")
	case <-d.parts.Died():
		part := d.parts.Cause()
		if part == partGateway {
			// The gateway's own part: the dispatcher, the sweeper.
			part = d.stack.Cause()
		}
		logger.Error("gateway dev: a component stopped unexpectedly; stopping everything", "component", "dev", "part", part)
		code = errmap.ExitInternal
	}
	stopDemo()
	<-demoDone

	done := make(chan struct{})
	go func() { d.stopAll(); close(done) }()
	select {
	case <-done:
	case <-time.After(o.StopTimeout):
		logger.Error("gateway dev: components did not stop in time", "component", "dev", "timeout", o.StopTimeout)
		return errmap.ExitInternal, nil
	}
	logger.Info("gateway dev: stopped", "component", "dev")
	return code, nil
}

// Options are what `gateway dev` runs: its parsed flags, and what the
// command line hands it (its output, logger and database checks).
type Options struct {
	// Schema is the PostgreSQL schema of fencegate's tables ("": the
	// default, fencegate).
	Schema      string
	Addr        string // the admin server's address (loopback)
	DataDir     string // "": a temporary directory removed on exit
	DatabaseURL string // "": a throwaway PostgreSQL
	NATSURL     string // "": an embedded NATS server
	NATSPort    int    // the embedded NATS server's port (0: a free one)
	SMTPAddr    string
	MailpitURL  string
	FileRoot    string
	Demo        bool
	// AllowFsyncOff lets DatabaseURL name a server with fsync=off.
	AllowFsyncOff bool

	// Stdout receives the ready object (Ready), Stderr the URLs for
	// people; Logger the logs.
	Stdout, Stderr io.Writer
	Logger         *slog.Logger
	// Connect opens a pool on a database URL and checks it answers (the
	// command line's connect).
	Connect func(ctx context.Context, dbURL string) (*pgxpool.Pool, error)
	// RequireFsync refuses a server running with fsync=off unless allow
	// (the command line's check, with its warning).
	RequireFsync func(ctx context.Context, pool *pgxpool.Pool, allow bool) error
	// RedactURL hides a URL's credentials for printing.
	RedactURL func(string) string
	// StopTimeout bounds stopping everything on a signal.
	StopTimeout time.Duration
}

// Validate checks the options the flags gave; errors name the flag's
// field.
func (o Options) Validate() error {
	host, _, err := net.SplitHostPort(o.Addr)
	if err != nil || host == "" {
		return errmap.Invalid("addr", fmt.Sprintf("--addr must be host:port, got %q", o.Addr))
	}
	// Dev configures no API tokens, so the admin server must not be
	// reachable from other machines.
	if ip, err := netip.ParseAddr(host); host != "localhost" && (err != nil || !ip.Unmap().IsLoopback()) {
		return errmap.Invalid("addr", fmt.Sprintf("--addr must be a loopback address (dev serves the admin API without tokens), got %q", o.Addr))
	}
	if o.NATSPort < 0 || o.NATSPort > 65535 {
		return errmap.Invalid("nats_port", "--nats-port must be between 0 and 65535")
	}
	if o.NATSPort != 0 && o.NATSURL != "" {
		return errmap.Invalid("nats_port", "--nats-port and --nats-url exclude each other")
	}
	if o.SMTPAddr != "" {
		if _, _, err := net.SplitHostPort(o.SMTPAddr); err != nil {
			return errmap.Invalid("smtp_addr", fmt.Sprintf("--smtp-addr must be host:port, got %q", o.SMTPAddr))
		}
	}
	if o.MailpitURL != "" {
		u, err := url.Parse(o.MailpitURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.HasSuffix(o.MailpitURL, "#") {
			return errmap.Invalid("mailpit_url", "--mailpit-url must be an http:// or https:// URL with a host and no query or fragment, e.g. http://127.0.0.1:8025 (the value is not shown: it may hold a password)")
		}
	}
	if o.FileRoot == "" {
		return errmap.Invalid("file_root", "--file-root must not be empty")
	}
	return nil
}

// devEnv is what `gateway dev` started: its parts, in start order, on a
// startstop.Group as the gateway's own (stopAll stops them in reverse; a
// watched part that stops on its own closes Died).
type devEnv struct {
	opts Options
	log  *slog.Logger

	parts startstop.Group

	dataDir  string
	pg       *pgcluster.Cluster // nil with --database-url
	dbURL    string
	pool     *pgxpool.Pool
	natsSrv  *natsserver.Server // nil with --nats-url
	natsURL  string
	sink     *devsmtp.Server // nil with --mailpit-url
	smtpAddr string
	echo     *echo // the built-in webhook receiver
	fileRoot string
	stack    *gateway.Gateway
	adminLn  net.Listener
	adminURL string
}

// partGateway names the relay and adapters (a gateway.Gateway) among the
// parts.
const partGateway = "relay and adapters"

// add records a started part (see startstop.Group.Add: stopped, when not
// nil, is watched).
func (d *devEnv) add(name string, stop func(), stopped <-chan struct{}) {
	d.parts.Add(name, func() {
		d.log.Debug("gateway dev: stopping "+name, "component", "dev")
		stop()
	}, stopped)
}

// stopAll stops every started part in reverse order. Safe to call twice.
func (d *devEnv) stopAll() { d.parts.StopAll() }

// start brings every service up in dependency order: data directory,
// PostgreSQL (and migrations), NATS, the SMTP sink, the file root, the
// relay and adapters, and the admin server.
func (d *devEnv) start(ctx context.Context) (Ready, error) {
	// The admin address is taken first, so a port in use fails at once
	// instead of after PostgreSQL started.
	ln, err := net.Listen("tcp", d.opts.Addr)
	if err != nil {
		// The hint only where it can be the cause: an address in use, not
		// one that names no port.
		hint := ""
		if errors.Is(err, syscall.EADDRINUSE) {
			hint = " (is another gateway dev running?)"
		}
		return Ready{}, errmap.Invalid("addr", "cannot listen on --addr"+hint+": "+errmap.OneLine(err.Error()))
	}
	d.adminLn = ln
	d.add("admin listener", func() { _ = ln.Close() }, nil)
	if err := d.startDataDir(); err != nil {
		return Ready{}, err
	}
	var root string
	if err := d.startPostgres(ctx); err != nil {
		return Ready{}, err
	}
	if err := d.startNATS(); err != nil {
		return Ready{}, err
	}
	if err := d.startMail(); err != nil {
		return Ready{}, err
	}
	// A fresh signing secret per run, known to the gateway and the echo
	// receiver only.
	hookSecret := webhook.NewSecret()
	if d.echo, err = startEcho(hookSecret); err != nil {
		return Ready{}, errmap.Invalid("webhook", "cannot start the echo receiver: "+errmap.OneLine(err.Error()))
	}
	d.add("webhook echo receiver", func() { _ = d.echo.Close() }, nil)
	root, err = filepath.Abs(d.opts.FileRoot)
	if err != nil {
		return Ready{}, errmap.Invalid("file_root", "--file-root: "+err.Error())
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return Ready{}, errmap.Invalid("file_root", "cannot create --file-root: "+errmap.OneLine(err.Error()))
	}
	d.fileRoot = root

	regs, reg, err := d.adapters(root, hookSecret)
	if err != nil {
		return Ready{}, err
	}
	cfg := gateway.Config{
		Schema:      d.opts.Schema,
		Pool:        d.pool,
		NATSURL:     d.natsURL,
		Dispatcher:  &dispatcher.Config{},
		Adapters:    regs,
		Idempotency: idempotency.Config{GroupCommit: true}, // as gateway run's default
		Registry:    reg,
		Logger:      d.log,
	}
	s, err := gateway.Start(ctx, cfg)
	if err != nil {
		return Ready{}, err
	}
	d.stack = s
	d.add(partGateway, s.Stop, s.Stopped())

	if err := d.startAdmin(); err != nil {
		return Ready{}, err
	}

	r := Ready{
		AdminURL: d.adminURL, NATSURL: d.natsURL, DatabaseURL: d.dbURL, SMTPAddr: d.smtpAddr,
		FileRoot: d.fileRoot, WebhookURL: d.echo.URL(), MailpitURL: d.opts.MailpitURL, DataDir: d.dataDir,
		DataDirKept: d.opts.DataDir != "", Demo: d.opts.Demo,
	}
	if d.pg != nil {
		r.PostgresPID = d.pg.PID()
	}
	return r, nil
}

// adapters makes the email, file and webhook adapters of the dev
// environment, the file adapter's metrics on the gateway's registry it
// returns too.
func (d *devEnv) adapters(root, hookSecret string) ([]adapters.Registration, *prometheus.Registry, error) {
	reg := gateway.NewRegistry()
	// Any From: the sink delivers nowhere.
	ecfg := email.Config{Addr: d.smtpAddr, Policy: email.Policy{AnyFrom: true}, Logger: d.log}
	if d.sink != nil {
		// The sink offers no STARTTLS; saying so skips the probe.
		ecfg.StartTLS = email.StartTLSNone
		ecfg.Lookup = d.sink
	} else {
		ecfg.Lookup = &email.MailpitLookup{BaseURL: strings.TrimRight(d.opts.MailpitURL, "/")}
	}
	e, err := email.New(ecfg)
	if err != nil {
		return nil, nil, errmap.Invalid("smtp_addr", errmap.OneLine(err.Error()))
	}
	f, err := file.New(file.Config{Root: root, Registerer: reg, Logger: d.log})
	if err != nil {
		return nil, nil, errmap.Invalid("file_root", errmap.OneLine(err.Error()))
	}
	// The echo receiver is the one destination allowed (its address
	// itself: it is on loopback); it dedups on the key, so a lost answer
	// is resent.
	w, err := webhook.New(webhook.Config{Allow: []string{d.echo.Addr()}, DedupsOnKey: []string{d.echo.Addr()}, Secrets: []string{hookSecret}, Logger: d.log})
	if err != nil {
		return nil, nil, errmap.Map(err)
	}
	return []adapters.Registration{e.Registration(), f.Registration(), w.Registration()}, reg, nil
}

// startDataDir creates the directory for PostgreSQL's cluster and the NATS
// store, unless both are external.
func (d *devEnv) startDataDir() error {
	if d.opts.DatabaseURL != "" && d.opts.NATSURL != "" {
		return nil
	}
	if d.opts.DataDir != "" {
		dir, err := filepath.Abs(d.opts.DataDir)
		if err != nil {
			return errmap.Invalid("data_dir", "--data-dir: "+err.Error())
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return errmap.Invalid("data_dir", "cannot create --data-dir: "+errmap.OneLine(err.Error()))
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
	}, nil)
	return nil
}

// startPostgres starts the throwaway cluster (or connects to
// --database-url), creates the fencegate database and applies the
// migrations.
func (d *devEnv) startPostgres(ctx context.Context) error {
	d.dbURL = d.opts.DatabaseURL
	if d.dbURL == "" {
		kept := d.opts.DataDir != ""
		c, err := pgcluster.Start(ctx, pgcluster.Options{
			Dir: filepath.Join(d.dataDir, "postgres"),
			// fsync on, throwaway or kept: dev shows the guarantee, and a
			// grant must survive a crash there too (the gateway refuses
			// fsync=off elsewhere).
			Durable: true,
			// A random password for TCP: another local user cannot
			// connect as superuser. It is in the printed database URL
			// (the export line and the JSON): the developer's own.
			PasswordAuth: true,
		})
		if err != nil {
			hint := ""
			if os.Geteuid() == 0 && kept {
				hint = " (as root, PostgreSQL runs as the postgres user: every directory above --data-dir must be searchable by it)"
			}
			return errmap.New(errmap.Unavailable, "start PostgreSQL: "+errmap.OneLine(err.Error())+hint)
		}
		d.pg = c
		d.add("PostgreSQL", func() {
			if err := c.Stop(); err != nil {
				d.log.Warn("gateway dev: PostgreSQL shutdown", "component", "dev", "error", err)
			}
		}, nil)
		if err := createDatabase(ctx, c.URL("postgres"), devDatabase); err != nil {
			return err
		}
		d.dbURL = c.URL(devDatabase)
	}
	pool, err := d.opts.Connect(ctx, d.dbURL)
	if err != nil {
		return err
	}
	d.pool = pool
	d.add("database pool", pool.Close, nil)
	if err := d.opts.RequireFsync(ctx, pool, d.opts.AllowFsyncOff); err != nil {
		return err
	}
	applied, err := migrations.Up(ctx, pool, migrations.Config{Schema: d.opts.Schema})
	var newer *migrations.NewerSchemaError
	if errors.As(err, &newer) {
		// A kept database a newer build migrated: left as it is.
		d.log.Warn("gateway dev: "+newer.Error(), "component", "dev")
		err = nil
	}
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
	if d.opts.NATSURL != "" {
		d.natsURL = d.opts.NATSURL
		return nil
	}
	port := d.opts.NATSPort
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
		return errmap.Invalid("nats_port", "embedded NATS: "+errmap.OneLine(err.Error()))
	}
	srv.Start()
	d.add("NATS", func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}, nil)
	if !srv.ReadyForConnections(10 * time.Second) {
		return errmap.New(errmap.Unavailable, fmt.Sprintf("embedded NATS did not start on 127.0.0.1:%d (is the port in use?)", d.opts.NATSPort))
	}
	if !srv.JetStreamEnabled() {
		return errmap.New(errmap.Unavailable, "embedded NATS started without JetStream")
	}
	d.natsSrv = srv
	d.natsURL = srv.ClientURL()
	return nil
}

// startMail starts the SMTP sink, or points at Mailpit.
func (d *devEnv) startMail() error {
	if d.opts.MailpitURL != "" {
		d.smtpAddr = d.opts.SMTPAddr
		if d.smtpAddr == "" {
			d.smtpAddr = "127.0.0.1:1025"
		}
		return nil
	}
	sink, err := devsmtp.Start(devsmtp.Config{Addr: d.opts.SMTPAddr, Logger: d.log})
	if err != nil {
		return errmap.Invalid("smtp_addr", errmap.OneLine(err.Error()))
	}
	d.sink = sink
	d.smtpAddr = sink.Addr()
	d.add("SMTP sink", func() { _ = sink.Close() }, nil)
	return nil
}

// startAdmin serves the admin API (and, as they come, its pages) on the
// listener start took for --addr. This is the one place dev wires it.
//
// Dev configures no tokens: admin then serves without authentication, and
// Options.Validate allows loopback addresses only.
func (d *devEnv) startAdmin() error {
	// The lease counters on the registry, as gateway run's admin issuer
	// (gateway/admin.go).
	issuer := lease.NewIssuer(d.pool, lease.WithSchema(d.opts.Schema), lease.WithRegisterer(d.stack.Registry()))
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
	d.add("admin server", srv.Stop, nil)
	return nil
}

// printReady writes the URLs for people on stderr and the JSON object on
// stdout.
func (d *devEnv) printReady(r Ready, took time.Duration) {
	w := d.opts.Stderr
	fmt.Fprintf(w, "\nfencegate dev is ready (%s)\n\n", took.Round(10*time.Millisecond))
	fmt.Fprintf(w, "  admin       %s\n", r.AdminURL)
	fmt.Fprintf(w, "  NATS        %s%s\n", d.opts.RedactURL(r.NATSURL), devNote(d.natsSrv == nil, "existing server", "embedded, JetStream"))
	fmt.Fprintf(w, "  PostgreSQL  %s%s\n", d.opts.RedactURL(r.DatabaseURL), devNote(d.pg == nil, "existing server", "throwaway, pid "+strconv.Itoa(r.PostgresPID)))
	if d.sink != nil {
		fmt.Fprintf(w, "  SMTP        %s (in-memory sink with result lookup)\n", r.SMTPAddr)
	} else {
		fmt.Fprintf(w, "  SMTP        %s (Mailpit, lookup via %s)\n", r.SMTPAddr, d.opts.RedactURL(r.MailpitURL))
	}
	fmt.Fprintf(w, "  file root   %s\n", r.FileRoot)
	fmt.Fprintf(w, "  webhook     %s (echo receiver, the one allowed destination; %s/requests lists what it got)\n", r.WebhookURL, r.WebhookURL)
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
	if d.opts.Schema != "" && d.opts.Schema != pgschema.Default {
		// The second shell's commands must work in the same schema.
		exports = append(exports, "GATEWAY_SCHEMA="+d.opts.Schema)
	}
	if len(exports) > 0 {
		fmt.Fprintf(w, "\n  export %s\n", strings.Join(exports, " "))
	}
	fmt.Fprintf(w, "\nPress Ctrl-C to stop.\n\n")
	// The object holds what dev started with its password (the
	// developer's own, to connect with); an existing server's URL, and
	// Mailpit's, were given and are shown without it, as on stderr.
	if d.pg == nil {
		r.DatabaseURL = d.opts.RedactURL(r.DatabaseURL)
	}
	if d.natsSrv == nil {
		r.NATSURL = d.opts.RedactURL(r.NATSURL)
	}
	if r.MailpitURL != "" {
		r.MailpitURL = d.opts.RedactURL(r.MailpitURL)
	}
	enc := json.NewEncoder(d.opts.Stdout)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(r)
}

func devNote(ext bool, yes, no string) string {
	if ext {
		return " (" + yes + ")"
	}
	return " (" + no + ")"
}
