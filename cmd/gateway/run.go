package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/email"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// defaultNATSURL is used when neither --nats-url nor $GATEWAY_NATS_URL is set.
const defaultNATSURL = "nats://127.0.0.1:4222"

// stopTimeout bounds how long `gateway run` waits for its components to stop
// after SIGTERM/SIGINT before it gives up and exits 1.
const stopTimeout = 30 * time.Second

// Defaults of the adapter flags of `gateway run`.
const (
	defaultAdapters = "email,file"
	defaultFileRoot = "./var/files"
	defaultSMTPAddr = "127.0.0.1:1025"
)

// Mail lookup modes (--mail-lookup).
const (
	mailLookupNone    = "none"
	mailLookupMailpit = "mailpit"
)

// builtinAdapters are the adapter kinds --adapters accepts.
var builtinAdapters = []string{email.Kind, file.Kind}

// cmdRun runs the relay and the adapters until SIGTERM or SIGINT.
//
// Relay flags: --dispatcher (default true) runs the relay; --nats-url
// (default $GATEWAY_NATS_URL, else nats://127.0.0.1:4222); --batch-size,
// --max-in-flight, --claim-ttl, --relay-timeout, --poll-interval,
// --publish-timeout, --stream-replicas, --duplicate-window (dispatcher
// defaults); --dispatcher-id (default host-pid-random).
//
// Adapter flags: --adapters (default email,file; "" runs none);
// --file-root; --smtp-addr, --smtp-starttls, --smtp-user, --smtp-password
// (default $GATEWAY_SMTP_PASSWORD), --smtp-insecure-skip-verify,
// --smtp-dedups-on-message-id, --mail-domain; --mail-lookup none|mailpit
// with --mailpit-url; --unknown-outcome hold|resend;
// --adapter-concurrency, --max-attempts.
//
// --db-max-conns bounds the database pool (default 0: sized from what the
// process runs, see stackConfig.poolSize); a pool_max_conns in the URL
// wins. The "gateway: running" line reports the size as db_max_conns.
//
// --metrics-addr serves Prometheus /metrics there (default empty: no
// metrics server; e.g. 127.0.0.1:9090); --log-level debug|info|warn|error.
// Logs go to stderr as slog text.
//
// --admin-addr serves the admin API and pages there (default empty: off;
// e.g. 127.0.0.1:8080), with the tokens of --tokens-file, else of
// $GATEWAY_TOKENS. Without tokens it binds loopback addresses only: any
// other address is exit 2 naming admin_addr. --lock-timeout (default 5s)
// bounds how long the intake's grants wait for a resource's control-row
// lock (then 503 busy).
//
// On SIGTERM/SIGINT the adapters stop taking messages and finish what they
// execute; the dispatcher stops claiming, waits for the PubAcks of what it
// published, marks those intents relayed and returns every other claim; the
// process exits 0.
func cmdRun(ctx context.Context, a *app, args []string) int {
	fs, dbURL := a.newFlags("run")
	var (
		runDispatcher = fs.Bool("dispatcher", true, "run the relay from the outbox to NATS JetStream")
		natsURL       = fs.String("nats-url", cmp.Or(a.getenv("GATEWAY_NATS_URL"), defaultNATSURL), "NATS URL (default $GATEWAY_NATS_URL or "+defaultNATSURL+")")
		dispatcherID  = fs.String("dispatcher-id", "", "dispatcher id recorded in claims (default host-pid-random; unique per process)")
		batchSize     = fs.Int("batch-size", dispatcher.DefaultBatchSize, "intents claimed per batch")
		maxInFlight   = fs.Int("max-in-flight", dispatcher.DefaultMaxInFlight, "published messages awaiting their PubAck, at most")
		claimTTL      = fs.Duration("claim-ttl", dispatcher.DefaultClaimTTL, "how long a claim lasts; a crashed dispatcher's claims return after it")
		relayTimeout  = fs.Duration("relay-timeout", dispatcher.DefaultRelayTimeout, "relay an intent again when it has no outcome this long after its relay")
		pollInterval  = fs.Duration("poll-interval", dispatcher.DefaultPollInterval, "look for work this often when no NOTIFY arrives")
		pubTimeout    = fs.Duration("publish-timeout", dispatcher.DefaultPublishTimeout, "wait this long for a PubAck")
		replicas      = fs.Int("stream-replicas", dispatcher.DefaultStreamReplicas, "replicas of the stream "+"GATEWAY_INTENTS")
		dupWindow     = fs.Duration("duplicate-window", dispatcher.DefaultDuplicateWindow, "the stream's duplicate window (keep it longer than --claim-ttl)")

		adapterList = fs.String("adapters", defaultAdapters, `adapters to run, comma-separated: email, file ("" runs none)`)
		fileRoot    = fs.String("file-root", defaultFileRoot, "directory the file adapter publishes under (created if missing)")
		smtpAddr    = fs.String("smtp-addr", defaultSMTPAddr, "SMTP server host:port of the email adapter")
		smtpTLS     = fs.String("smtp-starttls", email.StartTLSOpportunistic, "STARTTLS: none, opportunistic or required")
		smtpUser    = fs.String("smtp-user", "", "SMTP AUTH PLAIN user (default: no AUTH)")
		smtpPass    = fs.String("smtp-password", a.getenv("GATEWAY_SMTP_PASSWORD"), "SMTP AUTH password (default $GATEWAY_SMTP_PASSWORD)")
		smtpInsec   = fs.Bool("smtp-insecure-skip-verify", false, "do not verify the SMTP server's TLS certificate (tests only)")
		smtpDedups  = fs.Bool("smtp-dedups-on-message-id", false, "the SMTP destination drops a second message with the same Message-ID (lets --unknown-outcome resend resend email)")
		smtpMaxSess = fs.Int("smtp-max-sessions", email.DefaultMaxSessions, "SMTP sessions open at once at most (the email adapter's concurrency, below --adapter-concurrency)")
		mailDomain  = fs.String("mail-domain", email.DefaultDomain, "right-hand side of generated Message-IDs")
		mailLookup  = fs.String("mail-lookup", mailLookupNone, "result lookup of sent email: none or mailpit")
		mailpitURL  = fs.String("mailpit-url", "", "Mailpit's web root for --mail-lookup mailpit, e.g. http://127.0.0.1:8025")
		unknown     = fs.String("unknown-outcome", string(adapters.UnknownHold), "an attempt whose outcome is lost and cannot be looked up: hold (for an operator) or resend (only where the destination dedups)")
		concurrency = fs.Int("adapter-concurrency", adapters.DefaultConcurrency, "intents executed at once, per adapter")
		maxAttempts = fs.Int("max-attempts", 5, "execution attempts before a retryable error fails the intent")
		intentRet   = fs.Duration("intent-retention", outbox.DefaultSweepMaxAge, "delete completed intents this long after completion (unknown intents are kept for an operator); operation ids dedup this long, so it must be at least --key-retention")
		keyRet      = fs.Duration("key-retention", idempotency.DefaultRetention, "forget completed idempotency keys this long after completion")
		lockTimeout = fs.Duration("idempotency-lock-timeout", 5*time.Minute, "an attempt that owns an idempotency key this long without an outcome counts as abandoned (crashed): the next attempt looks the outcome up first; keep it well above --execute-timeout")
		groupCommit = fs.Bool("idempotency-group-commit", true, "concurrent attempts share the durable transactions that begin and complete them (same guarantees, one commit per batch); false: one transaction each")
		execTimeout = fs.Duration("execute-timeout", 30*time.Second, "bound on one effect's execution (an SMTP send, a file publication)")
		settle      = fs.Duration("lookup-settle", adapters.DefaultLookupSettle, "a result lookup that finds nothing is trusted as proof the effect did not happen only this long after the attempt's last I/O with the destination (until then the intent waits, its key held); size it above the longest delay with which the destination shows an effect")

		metricsAddr = fs.String("metrics-addr", "", "serve Prometheus /metrics on this address, e.g. 127.0.0.1:9090 (default: off)")
		adminAddr   = fs.String("admin-addr", "", "serve the admin API and pages on this address, e.g. 127.0.0.1:8080 (default: off)")
		tokensFile  = fs.String("tokens-file", "", "admin API tokens, name:role:token per line or a JSON array (default $"+admin.EnvTokens+")")
		leaseLockTO = lockTimeoutFlag(fs)
		logLevel    = fs.String("log-level", "info", "log level: debug, info, warn, error")

		allowFsyncOff = a.fsyncFlag(fs)
		dbMaxConns    = fs.Int("db-max-conns", 0, "connections of the database pool at most; 0 sizes it from what the process runs (see poolSize; 32 with the defaults); a pool_max_conns in the database URL wins")
	)
	if code, ok := a.parse(fs, args); !ok {
		return code
	}
	if err := noArgs(fs); err != nil {
		return a.fail(err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return a.fail(badInput("log_level", "--log-level must be debug, info, warn or error"))
	}
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
	kinds, err := parseAdapters(*adapterList)
	if err != nil {
		return a.fail(err)
	}
	tokens, err := loadTokens(*tokensFile, a.getenv)
	if err != nil {
		return a.fail(err)
	}

	cfg := stackConfig{
		NATSURL:       *natsURL,
		RunDispatcher: *runDispatcher,
		Dispatcher: dispatcher.Config{
			ID:              *dispatcherID,
			BatchSize:       *batchSize,
			MaxInFlight:     *maxInFlight,
			ClaimTTL:        *claimTTL,
			RelayTimeout:    *relayTimeout,
			PollInterval:    *pollInterval,
			PublishTimeout:  *pubTimeout,
			StreamReplicas:  *replicas,
			DuplicateWindow: *dupWindow,
		},
		Adapters: kinds,
		File:     file.Config{Root: *fileRoot},
		Email: email.Config{
			Addr:               *smtpAddr,
			StartTLS:           *smtpTLS,
			Username:           *smtpUser,
			Password:           *smtpPass,
			InsecureSkipVerify: *smtpInsec,
			DedupsOnKey:        *smtpDedups,
			Domain:             *mailDomain,
			MaxSessions:        *smtpMaxSess,
		},
		MailLookup: *mailLookup,
		MailpitURL: *mailpitURL,
		Runtime: adapters.Config{
			Concurrency:    *concurrency,
			MaxAttempts:    *maxAttempts,
			ExecuteTimeout: *execTimeout,
			AckWait:        max(60*time.Second, 2**execTimeout),
			Unknown:        adapters.UnknownPolicy(*unknown),
			LookupSettle:   *settle,
		},
		Idempotency: idempotency.Config{LockTimeout: *lockTimeout, Retention: *keyRet, GroupCommit: *groupCommit},
		Retention:   outbox.SweeperConfig{MaxAge: *intentRet},
		MetricsAddr: *metricsAddr,
		AdminAddr:   *adminAddr,
		Tokens:      tokens,
		Logger:      logger,
	}
	if h := a.runHooks; h != nil {
		cfg.ExtraExecutors = h.executors // gateway bench's no-op adapter
	}
	// Flags are checked before anything is connected: a bad value is exit 2
	// whether or not the database is reachable.
	if err := cfg.validate(); err != nil {
		return a.fail(err)
	}
	if *concurrency < 1 {
		return a.fail(badInput("adapter_concurrency", "--adapter-concurrency must be at least 1"))
	}
	if *smtpMaxSess < 1 {
		return a.fail(badInput("smtp_max_sessions", "--smtp-max-sessions must be at least 1"))
	}
	if *maxAttempts < 1 {
		return a.fail(badInput("max_attempts", "--max-attempts must be at least 1"))
	}
	if *execTimeout <= 0 {
		return a.fail(badInput("execute_timeout", "--execute-timeout must be positive"))
	}
	if err := checkLockTimeout(*leaseLockTO); err != nil {
		return a.fail(err)
	}
	cfg.IssuerOptions = []lease.Option{lease.WithLockTimeout(*leaseLockTO)}
	if *settle <= 0 {
		return a.fail(badInput("lookup_settle", "--lookup-settle must be positive"))
	}
	// A lock that expires while its attempt still runs would let a second
	// attempt take the key over (Recover) mid-effect.
	if *lockTimeout <= 2**execTimeout {
		return a.fail(badInput("idempotency_lock_timeout", "--idempotency-lock-timeout must be more than twice --execute-timeout"))
	}

	if *dbMaxConns < 0 {
		return a.fail(badInput("db_max_conns", "--db-max-conns must be 0 (sized automatically) or more"))
	}
	pool, err := a.connectSized(ctx, *dbURL, cmp.Or(int32(min(*dbMaxConns, math.MaxInt32)), cfg.poolSize()))
	if err != nil {
		return a.fail(err)
	}
	defer pool.Close()
	if err := a.requireFsync(ctx, pool, *allowFsyncOff); err != nil {
		return a.fail(err)
	}
	cfg.Pool = pool

	s, err := startStack(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			// SIGTERM while starting (adapters wait for the stream until
			// then): nothing was left running, and stopping is what was asked.
			logger.Info("gateway: stopped before running", "component", "gateway", "error", err)
			return exitOK
		}
		return a.fail(err)
	}
	if h := a.runHooks; h != nil && h.started != nil {
		h.started(pool)
	}

	logger.Info("gateway: running", "component", "gateway", "dispatcher", cfg.RunDispatcher,
		"adapters", strings.Join(cfg.Adapters, ","), "nats_url", redactNATS(cfg.NATSURL),
		"db_max_conns", pool.Config().MaxConns)
	select {
	case <-ctx.Done():
		logger.Info("gateway: stopping", "component", "gateway")
	case <-s.Stopped():
		logger.Error("gateway: a component stopped unexpectedly; stopping the rest", "component", "gateway", "which", s.cause())
		s.Stop()
		return exitInternal
	}

	done := make(chan struct{})
	go func() { s.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopTimeout):
		logger.Error("gateway: components did not stop in time", "component", "gateway", "timeout", stopTimeout)
		return exitInternal
	}
	logger.Info("gateway: stopped", "component", "gateway")
	return exitOK
}

// loadTokens reads the admin API's tokens from --tokens-file when given,
// else from $GATEWAY_TOKENS; none when neither is set. Errors name the
// source, never a secret.
func loadTokens(file string, getenv func(string) string) ([]admin.Token, error) {
	if file != "" {
		t, err := admin.LoadTokensFile(file)
		if err != nil {
			return nil, badInput("tokens_file", "--tokens-file: "+oneLine(err.Error()))
		}
		return t, nil
	}
	t, err := admin.TokensFromEnv(getenv)
	if err != nil {
		return nil, badInput("tokens", "$"+admin.EnvTokens+": "+oneLine(err.Error()))
	}
	return t, nil
}

// parseAdapters parses --adapters: a comma-separated list of built-in kinds;
// empty means none.
func parseAdapters(list string) ([]string, error) {
	var kinds []string
	for k := range strings.SplitSeq(list, ",") {
		k = strings.TrimSpace(k)
		switch {
		case k == "":
			continue
		case !slices.Contains(builtinAdapters, k):
			return nil, badInput("adapters", fmt.Sprintf("--adapters: unknown adapter %q (known: %s)", k, strings.Join(builtinAdapters, ", ")))
		case slices.Contains(kinds, k):
			return nil, badInput("adapters", fmt.Sprintf("--adapters: %q given twice", k))
		}
		kinds = append(kinds, k)
	}
	return kinds, nil
}

// stackConfig is everything `gateway run` (and `gateway dev`) wires: the
// relay, the adapter runtime with its adapters and the idempotency sweeper,
// and the metrics server. Zero fields take the components' defaults.
type stackConfig struct {
	// Pool is the PostgreSQL pool (the primary). Required by startStack;
	// not closed by Stop.
	Pool *pgxpool.Pool
	// NC is the NATS connection to use. Nil: startStack dials NATSURL
	// (reconnecting forever) and Stop closes it. A given NC is not closed.
	NC *nats.Conn
	// NATSURL is dialled when NC is nil. Default defaultNATSURL.
	NATSURL string

	// RunDispatcher runs the relay (outbox → JetStream).
	RunDispatcher bool
	// Dispatcher configures the relay. Registerer and Logger default to the
	// stack's.
	Dispatcher dispatcher.Config

	// Adapters lists the built-in adapters to run ("email", "file"). Empty
	// with no ExtraExecutors: no adapter runtime.
	Adapters []string
	// File configures the file adapter (Root required when it runs; Logger
	// defaults to the stack's).
	File file.Config
	// Email configures the email adapter (Addr required when it runs).
	// Lookup defaults to the one MailLookup names; Logger to the stack's.
	Email email.Config
	// MailLookup is "none" (default) or "mailpit" (then MailpitURL is
	// required). Ignored when Email.Lookup is set.
	MailLookup string
	// MailpitURL is Mailpit's web root for MailLookup "mailpit".
	MailpitURL string
	// Runtime configures the adapter runtime (Concurrency, MaxAttempts,
	// Unknown, …). Its Executors are the built-in adapters followed by
	// ExtraExecutors; Registerer and Logger default to the stack's.
	Runtime adapters.Config
	// ExtraExecutors run beside the built-in adapters (tests, bench).
	ExtraExecutors []adapters.Executor
	// Idempotency configures the idempotency store (and its sweeper, which
	// runs whenever the adapter runtime does). Logger defaults to the
	// stack's.
	Idempotency idempotency.Config
	// Retention configures the intent sweeper, which runs with the
	// dispatcher and deletes completed intents past their age.
	Retention outbox.SweeperConfig

	// MetricsAddr serves Prometheus /metrics there. Empty: no server.
	MetricsAddr string
	// AdminAddr serves the admin API and pages there. Empty: no admin
	// server. Without Tokens it must be a loopback address.
	AdminAddr string
	// Tokens are the admin API's tokens. None: unauthenticated, loopback
	// only.
	Tokens []admin.Token
	// IssuerOptions configure the admin intake's lease.Issuer (e.g.
	// lease.WithLockTimeout from --lock-timeout).
	IssuerOptions []lease.Option
	// Registry receives every component's metrics. Nil: a new registry
	// with the Go and process collectors.
	Registry *prometheus.Registry
	// Logger. Nil: discard.
	Logger *slog.Logger
}

// runsAdapters reports whether the stack runs the adapter runtime.
func (c *stackConfig) runsAdapters() bool {
	return len(c.Adapters) > 0 || len(c.ExtraExecutors) > 0
}

// validate checks the configuration without connecting to anything; its
// errors are bad input naming the flag's field.
func (c *stackConfig) validate() error {
	if !c.RunDispatcher && !c.runsAdapters() {
		return badInput("adapters", "nothing to run: --dispatcher=false and --adapters is empty")
	}
	for _, k := range c.Adapters {
		if !slices.Contains(builtinAdapters, k) {
			return badInput("adapters", fmt.Sprintf("unknown adapter %q (known: %s)", k, strings.Join(builtinAdapters, ", ")))
		}
	}
	if slices.Contains(c.Adapters, file.Kind) && c.File.Root == "" {
		return badInput("file_root", "--file-root must not be empty when the file adapter runs")
	}
	switch c.MailLookup {
	case "", mailLookupNone:
	case mailLookupMailpit:
		if c.MailpitURL == "" {
			return badInput("mailpit_url", "--mail-lookup mailpit needs --mailpit-url, e.g. http://127.0.0.1:8025")
		}
	default:
		return badInput("mail_lookup", fmt.Sprintf("--mail-lookup must be none or mailpit, got %q", c.MailLookup))
	}
	if c.MailpitURL != "" {
		u, err := url.Parse(c.MailpitURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return badInput("mailpit_url", "--mailpit-url must be an http:// or https:// URL, e.g. http://127.0.0.1:8025")
		}
	}
	if host, port, err := net.SplitHostPort(c.Email.Addr); slices.Contains(c.Adapters, email.Kind) && (err != nil || host == "" || port == "") {
		return badInput("smtp_addr", fmt.Sprintf("--smtp-addr must be host:port, got %q", c.Email.Addr))
	}
	switch c.Email.StartTLS {
	case "", email.StartTLSNone, email.StartTLSOpportunistic, email.StartTLSRequired:
	default:
		return badInput("smtp_starttls", fmt.Sprintf("--smtp-starttls must be none, opportunistic or required, got %q", c.Email.StartTLS))
	}
	if c.Email.Password != "" && c.Email.Username == "" {
		return badInput("smtp_user", "an SMTP password is set (--smtp-password or $GATEWAY_SMTP_PASSWORD) without --smtp-user")
	}
	if strings.ContainsAny(c.Email.Domain, "<>@ \t\r\n") {
		return badInput("mail_domain", fmt.Sprintf("--mail-domain %q is not a valid Message-ID domain", c.Email.Domain))
	}
	switch c.Runtime.Unknown {
	case "", adapters.UnknownHold, adapters.UnknownResend:
	default:
		return badInput("unknown_outcome", fmt.Sprintf("--unknown-outcome must be hold or resend, got %q", c.Runtime.Unknown))
	}
	if c.AdminAddr != "" {
		if err := admin.CheckListenAddr(c.AdminAddr, c.Tokens); err != nil {
			if errors.Is(err, admin.ErrNoTokensNonLoopback) {
				return badInput("admin_addr", fmt.Sprintf("--admin-addr %q is not a loopback address and no admin tokens are configured "+
					"(--tokens-file or $%s): bind 127.0.0.1 or configure tokens", c.AdminAddr, admin.EnvTokens))
			}
			return badInput("admin_addr", "--admin-addr must be host:port, e.g. 127.0.0.1:8080: "+oneLine(err.Error()))
		}
	}
	if c.Runtime.Concurrency < 0 {
		return badInput("adapter_concurrency", "--adapter-concurrency must be at least 1")
	}
	if c.Runtime.MaxAttempts < 0 {
		return badInput("max_attempts", "--max-attempts must be at least 1")
	}
	// Checked whatever this process runs: the sweepers may run in different
	// processes, which must all be given the same retentions.
	if err := outbox.CheckRetention(c.Retention.MaxAge, c.Idempotency.WithDefaults().Retention); err != nil {
		var ve *outbox.ValidationError
		msg := err.Error()
		if errors.As(err, &ve) {
			msg = ve.Message
		}
		return badInput("intent_retention", "--intent-retention must not be shorter than --key-retention: "+msg)
	}
	return nil
}

// stack is a running set of components started by startStack.
type stack struct {
	log      *slog.Logger
	registry *prometheus.Registry

	nc         *nats.Conn
	dispatcher *dispatcher.Dispatcher // nil unless RunDispatcher
	outbox     *outbox.Client
	store      *idempotency.Store
	sweeper    *idempotency.Sweeper
	runtime    *adapters.Runtime // nil unless adapters run
	email      *email.Adapter    // nil unless the email adapter runs
	file       *file.Adapter     // nil unless the file adapter runs
	// metricsAddr is the address the metrics server listens on (the actual
	// one, for ":0"); empty without a server.
	metricsAddr string
	// adminAddr is the address the admin server listens on (the actual
	// one); empty without it.
	adminAddr string

	// parts are the started components in start order; Stop stops them in
	// reverse.
	parts    []part
	stopping chan struct{}
	stopOnce sync.Once
	died     chan struct{}
	dieOnce  sync.Once
	mu       sync.Mutex
	diedPart string
}

// part is one started component.
type part struct {
	name    string
	stop    func()
	stopped <-chan struct{} // nil: not watched
}

// startStack starts the configured components in dependency order — NATS
// connection, metrics server, admin server, dispatcher, idempotency sweeper,
// adapter runtime — and returns once they run. The adapter runtime waits for the
// stream (which a dispatcher creates) until ctx ends. On error, whatever was
// started is stopped again. Config errors are bad input (*cliError).
//
// ctx only bounds starting: the components run until Stop, so that
// Stopped means a component died, never that ctx ended.
func startStack(ctx context.Context, cfg stackConfig) (_ *stack, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Pool == nil {
		return nil, errors.New("startStack: no pool")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	s := &stack{log: log, registry: reg, stopping: make(chan struct{}), died: make(chan struct{})}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	runCtx := context.WithoutCancel(ctx)

	// NATS first: both the dispatcher and the adapters use it.
	s.nc = cfg.NC
	if s.nc == nil {
		natsURL := cmp.Or(cfg.NATSURL, defaultNATSURL)
		nc, err := dialNATS(natsURL, log)
		if err != nil {
			return nil, badInput("nats_url", "cannot use the NATS URL: "+oneLine(err.Error()))
		}
		s.nc = nc
		s.add(part{name: "nats", stop: nc.Close})
	}

	// The metrics server before the components that may wait (the adapter
	// runtime waits for the stream): it answers meanwhile.
	if cfg.MetricsAddr != "" {
		if err := s.serveMetrics(cfg.MetricsAddr); err != nil {
			return nil, err
		}
	}

	if err := s.clients(cfg, log, reg); err != nil {
		return nil, err
	}
	// The admin server early too: /healthz answers while adapters wait.
	if cfg.AdminAddr != "" {
		if err := s.serveAdmin(cfg, log, reg); err != nil {
			return nil, err
		}
	}

	if cfg.RunDispatcher {
		dcfg := cfg.Dispatcher
		if dcfg.Registerer == nil {
			dcfg.Registerer = reg
		}
		dcfg.Logger = cmp.Or(dcfg.Logger, log)
		d, err := dispatcher.New(cfg.Pool, s.nc, dcfg)
		if err != nil {
			return nil, badInput("flags", err.Error())
		}
		// Started before the adapters: it creates the stream they wait for.
		if err := d.Start(runCtx); err != nil {
			return nil, err
		}
		s.dispatcher = d
		s.add(part{name: "dispatcher", stop: d.Stop, stopped: d.Stopped()})

		// Retention: completed intents older than their age go, in small
		// batches (SKIP LOCKED: several processes may sweep at once).
		rcfg := cfg.Retention
		rcfg.KeyRetention = cfg.Idempotency.WithDefaults().Retention
		rcfg.Logger = cmp.Or(rcfg.Logger, log)
		sw, err := outbox.NewSweeper(cfg.Pool, rcfg)
		if err != nil {
			return nil, badInput("intent_retention", err.Error())
		}
		if err := sw.Start(runCtx); err != nil {
			return nil, err
		}
		s.add(part{name: "intent_sweeper", stop: sw.Stop, stopped: sw.Stopped()})
	}

	if cfg.runsAdapters() {
		if err := s.startAdapters(ctx, cfg, log, reg); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// startAdapters builds the adapters and starts the idempotency sweeper and
// the adapter runtime.
func (s *stack) startAdapters(ctx context.Context, cfg stackConfig, log *slog.Logger, reg *prometheus.Registry) error {
	var execs []adapters.Executor
	for _, k := range cfg.Adapters {
		switch k {
		case email.Kind:
			ecfg := cfg.Email
			ecfg.Logger = cmp.Or(ecfg.Logger, log)
			if ecfg.Lookup == nil && cfg.MailLookup == mailLookupMailpit {
				ecfg.Lookup = &email.MailpitLookup{BaseURL: strings.TrimRight(cfg.MailpitURL, "/")}
			}
			e, err := email.New(ecfg)
			if err != nil {
				return badInput("smtp_addr", oneLine(err.Error()))
			}
			if ecfg.Lookup == nil && !(ecfg.DedupsOnKey && cfg.Runtime.Unknown == adapters.UnknownResend) {
				log.Warn("gateway: email has no result lookup: an attempt whose outcome is lost is held as unknown for an operator (see --mail-lookup)",
					"component", "gateway")
			}
			s.email = e
			execs = append(execs, e)
		case file.Kind:
			fcfg := cfg.File
			fcfg.Registerer = cmp.Or[prometheus.Registerer](fcfg.Registerer, reg)
			fcfg.Logger = cmp.Or(fcfg.Logger, log)
			f, err := file.New(fcfg)
			if err != nil {
				return badInput("file_root", oneLine(err.Error()))
			}
			s.file = f
			execs = append(execs, f)
		}
	}
	execs = append(execs, cfg.ExtraExecutors...)

	store, ob := s.store, s.outbox

	rcfg := cfg.Runtime
	rcfg.Executors = execs
	if rcfg.Registerer == nil {
		rcfg.Registerer = reg
	}
	rcfg.Logger = cmp.Or(rcfg.Logger, log)
	rt, err := adapters.NewRuntime(cfg.Pool, s.nc, store, ob, rcfg)
	if err != nil {
		return badInput("adapters", err.Error())
	}

	// The sweeper forgets completed keys past their retention; it only
	// matters where keys are made, so it runs with the adapters.
	sw := idempotency.NewSweeper(store)
	if err := sw.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	s.sweeper = sw
	s.add(part{name: "idempotency_sweeper", stop: sw.Stop, stopped: sw.Stopped()})

	// Start waits for the stream until ctx ends: adapters started before
	// any dispatcher (or while NATS is down) wait here.
	if err := rt.Start(ctx); err != nil {
		return err
	}
	s.runtime = rt
	// Stopped last: in-flight executions finish before the sweeper, the
	// dispatcher and the NATS connection go.
	s.add(part{name: "adapters", stop: rt.Stop, stopped: rt.Stopped()})
	return nil
}

// clients makes the idempotency store and the outbox client the adapters
// and the admin server share.
func (s *stack) clients(cfg stackConfig, log *slog.Logger, reg *prometheus.Registry) error {
	icfg := cfg.Idempotency
	icfg.Logger = cmp.Or(icfg.Logger, log)
	if icfg.Registerer == nil {
		icfg.Registerer = reg
	}
	store, err := idempotency.New(cfg.Pool, icfg)
	if err != nil {
		return badInput("flags", err.Error())
	}
	s.store = store
	ob, err := outbox.New(cfg.Pool, outbox.Config{Logger: log, Registerer: s.registry})
	if err != nil {
		return err
	}
	s.outbox = ob
	return nil
}

// serveAdmin starts the admin API and pages on cfg.AdminAddr. Readiness
// checks PostgreSQL and the stack's NATS connection.
func (s *stack) serveAdmin(cfg stackConfig, log *slog.Logger, reg *prometheus.Registry) error {
	acfg := admin.Config{
		Pool:     cfg.Pool,
		Outbox:   s.outbox,
		Issuer:   lease.NewIssuer(cfg.Pool, append([]lease.Option{lease.WithRegisterer(reg)}, cfg.IssuerOptions...)...),
		Store:    s.store,
		Tokens:   cfg.Tokens,
		Registry: reg,
		Logger:   log,
	}
	if nc := s.nc; nc != nil {
		acfg.NATSReady = func() error {
			if st := nc.Status(); st != nats.CONNECTED {
				return fmt.Errorf("NATS connection is %s", st)
			}
			return nil
		}
	}
	srv, err := admin.New(acfg)
	if err != nil {
		return badInput("tokens", oneLine(err.Error()))
	}
	ln, err := srv.Listen(cfg.AdminAddr)
	if err != nil {
		return badInput("admin_addr", "cannot listen on --admin-addr: "+oneLine(err.Error()))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.ServeListener(ctx, ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("gateway: admin server", "component", "gateway", "error", err)
		}
	}()
	s.adminAddr = ln.Addr().String()
	s.add(part{name: "admin", stopped: done, stop: func() {
		cancel()
		<-done
	}})
	log.Info("gateway: serving the admin API and pages", "component", "gateway", "addr", s.adminAddr,
		"url", "http://"+s.adminAddr+"/", "tokens", len(cfg.Tokens))
	return nil
}

// dialNATS connects to NATS, waiting for a server that is down at start
// like one that goes away later.
func dialNATS(natsURL string, log *slog.Logger) (*nats.Conn, error) {
	return nats.Connect(natsURL,
		nats.Name("fencegate-gateway"),
		// A NATS server that is down at start is waited for like one that
		// goes away later: the dispatcher backs off until it is back.
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		// No client-side buffering while disconnected: a publish fails at
		// once, its claim is returned, and the dispatcher backs off,
		// instead of a buffered message going out long after its claim
		// expired.
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("gateway: NATS disconnected", "component", "gateway", "error", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("gateway: NATS reconnected", "component", "gateway", "url", c.ConnectedUrlRedacted())
		}),
	)
}

// serveMetrics starts the Prometheus /metrics server.
func (s *stack) serveMetrics(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return badInput("metrics_addr", "cannot listen on --metrics-addr: "+oneLine(err.Error()))
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("gateway: metrics server", "component", "gateway", "error", err)
		}
	}()
	s.metricsAddr = ln.Addr().String()
	s.add(part{name: "metrics", stopped: done, stop: func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}})
	s.log.Info("gateway: serving metrics", "component", "gateway", "addr", s.metricsAddr)
	return nil
}

// add records a started component and watches it: if it stops before Stop
// was called, Stopped is closed.
func (s *stack) add(p part) {
	s.parts = append(s.parts, p)
	if p.stopped == nil {
		return
	}
	go func() {
		select {
		case <-p.stopped:
		case <-s.stopping:
			return
		}
		select {
		case <-s.stopping:
			// Stopped by Stop, racing this watcher: expected.
		default:
			s.log.Error("gateway: component stopped unexpectedly", "component", "gateway", "part", p.name)
			s.dieOnce.Do(func() {
				s.mu.Lock()
				s.diedPart = p.name
				s.mu.Unlock()
				close(s.died)
			})
		}
	}()
}

// Stop stops every component in the reverse of their start order and
// returns when they have stopped: the adapters finish their in-flight
// executions, the dispatcher returns its claims, then the NATS connection
// (if the stack dialled it) closes. Safe to call more than once.
func (s *stack) Stop() {
	s.stopOnce.Do(func() {
		close(s.stopping)
		for i := len(s.parts) - 1; i >= 0; i-- {
			s.parts[i].stop()
		}
	})
}

// Stopped is closed when a component stopped without Stop being called
// (a dispatcher's own failure, the metrics server failing). The caller
// should then Stop the rest and exit non-zero.
func (s *stack) Stopped() <-chan struct{} { return s.died }

// cause names the component whose stop closed Stopped, or "".
func (s *stack) cause() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.diedPart
}

// redactNATS hides credentials in a NATS URL list for logging.
func redactNATS(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		parts[i] = redactURL(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}
