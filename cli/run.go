package cli

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/gateway"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// defaultNATSURL is used when neither --nats-url nor $GATEWAY_NATS_URL is set.
const defaultNATSURL = gateway.DefaultNATSURL

// stopTimeout bounds how long `gateway run` waits for its components to stop
// after SIGTERM/SIGINT before it gives up and exits 1, when it runs no
// adapter; with adapters the bound is stopBound's.
const stopTimeout = 30 * time.Second

// stopRecordMargin is what a stop allows an execution beyond its own
// --execute-timeout: the Begin before it, the recording (or lookup) after.
const stopRecordMargin = 30 * time.Second

// stopBound is how long a stop waits for the components. With adapters it
// is the execute timeout plus stopRecordMargin (at least stopTimeout): an
// execution that began just before the signal may run its whole timeout,
// and a bound of the timeout alone cut such an execution off after the
// request had left, its outcome unrecorded and its key owned until the lock
// expired (TestRunSIGTERMWaitsForASlowExecution).
func stopBound(cfg gateway.Config) time.Duration {
	// An adapter with an Executor runs here; the others only give the
	// intake its rules.
	if !slices.ContainsFunc(cfg.Adapters, func(r adapters.Registration) bool { return r.Executor != nil }) {
		return stopTimeout
	}
	return max(stopTimeout, cfg.Runtime.WithDefaults().ExecuteTimeout+stopRecordMargin)
}

// defaultAdapters is --adapters' default.
const defaultAdapters = "email,file"

// cmdRun runs the relay and the adapters until SIGTERM or SIGINT.
//
// Relay flags: --dispatcher (default true) runs the relay; --nats-url
// (default $GATEWAY_NATS_URL, else nats://127.0.0.1:4222; comma-separated
// seeds of a cluster) and --nats-ping-interval (default 2s: a server that
// answers neither of two pings is left for another seed); --batch-size,
// --max-in-flight, --claim-ttl, --relay-timeout, --poll-interval,
// --publish-timeout, --stream-replicas, --duplicate-window,
// --stream-max-age (dispatcher defaults); --dispatcher-id (default host-pid-random).
//
// Adapter flags: --adapters (default email,file; "" runs none);
// --file-root; --smtp-addr, --smtp-starttls, --smtp-user, --smtp-password
// (default $GATEWAY_SMTP_PASSWORD), --smtp-insecure-skip-verify,
// --smtp-dedups-on-message-id, --mail-domain; --mail-lookup none|mailpit
// with --mailpit-url; --unknown-outcome hold|resend;
// --adapter-concurrency, --max-attempts.
//
// --db-max-conns bounds the database pool (default 0: sized from what the
// process runs, see gateway.Config.PoolSize); a pool_max_conns in the URL
// wins. The "gateway: running" line reports the size as db_max_conns.
//
// --metrics-addr serves Prometheus /metrics and the probes there, without
// a token (default empty: no metrics server; e.g. 127.0.0.1:9090): a
// loopback address unless --metrics-allow-remote, else exit 2 naming
// metrics_addr; --log-level debug|info|warn|error.
// Logs go to stderr as slog text.
//
// --admin-addr serves the admin API and pages there (default empty: off;
// e.g. 127.0.0.1:8080), with the tokens of --tokens-file, else of
// $GATEWAY_TOKENS. Without tokens it binds loopback addresses only: any
// other address is exit 2 naming admin_addr. --lock-timeout (default 5s)
// bounds how long the intake's grants and enqueues wait for a resource's
// control-row lock (then 503 busy). --failover-epoch-jump (default 1,000,000) is how
// far the intake's first grant after a failover raises every epoch
// (lease.WithFailoverEpochJump).
//
// On SIGTERM/SIGINT the adapters stop taking messages and finish what they
// execute; the dispatcher stops claiming, waits for the PubAcks of what it
// published, marks those intents relayed and returns every other claim; the
// process exits 0. It waits at most stopBound (--execute-timeout + 30 s
// with adapters), then exits 1 naming the intents it abandons.
func cmdRun(ctx context.Context, a *app, args []string) int {
	fs, dbURL := a.newFlags("run")
	var (
		runDispatcher = fs.Bool("dispatcher", true, "run the relay from the outbox to NATS JetStream")
		natsURL       = fs.String("nats-url", cmp.Or(a.getenv("GATEWAY_NATS_URL"), defaultNATSURL), "NATS URL (default $GATEWAY_NATS_URL or "+defaultNATSURL+")")
		dispatcherID  = fs.String("dispatcher-id", "", "dispatcher id recorded in claims (default host-pid-random; unique per process)")
		batchSize     = fs.Int("batch-size", dispatcher.DefaultBatchSize, "intents claimed per batch")
		maxInFlight   = fs.Int("max-in-flight", dispatcher.DefaultMaxInFlight, "published messages awaiting their PubAck, at most")
		claimTTL      = fs.Duration("claim-ttl", dispatcher.DefaultClaimTTL, "how long a claim may stay silent; a hung dispatcher's claims return after it (a dead one's at once)")
		natsCreds     = fs.String("nats-creds", "", "NATS credentials file (JWT and NKey seed) to authenticate with")
		natsNKey      = fs.String("nats-nkey", "", "NATS NKey seed file to authenticate with")
		natsTLSCA     = fs.String("nats-tls-ca", "", "CA certificates (PEM) to verify the NATS server with (default: the system's)")
		natsTLSCert   = fs.String("nats-tls-cert", "", "client certificate (PEM) for NATS TLS, with --nats-tls-key")
		natsTLSKey    = fs.String("nats-tls-key", "", "client certificate's key (PEM) for NATS TLS")
		natsPing      = fs.Duration("nats-ping-interval", gateway.DefaultNATSPingInterval, "ping the NATS server this often; two unanswered pings and the connection moves to another --nats-url seed (a hung server keeps its socket open)")
		relayTimeout  = fs.Duration("relay-timeout", dispatcher.DefaultRelayTimeout, "relay an intent again when it has no outcome this long after its relay")
		pollInterval  = fs.Duration("poll-interval", dispatcher.DefaultPollInterval, "look for work this often when no NOTIFY arrives")
		pubTimeout    = fs.Duration("publish-timeout", dispatcher.DefaultPublishTimeout, "wait this long for a PubAck")
		replicas      = fs.Int("stream-replicas", dispatcher.DefaultStreamReplicas, "replicas of the stream GATEWAY_INTENTS_<namespace>")
		dupWindow     = fs.Duration("duplicate-window", dispatcher.DefaultDuplicateWindow, "the stream's duplicate window (keep it longer than --claim-ttl)")
		streamMaxAge  = fs.Duration("stream-max-age", 0, "how long the stream keeps a message (an intent whose message it dropped unsettled is relayed again); 0: 1h, or --duplicate-window if longer; must be at least --duplicate-window")

		adapterList = fs.String("adapters", defaultAdapters, `adapters to run, comma-separated: email, file, webhook, s3 and a program's own kinds ("" runs none); default email,file, and webhook too when --webhook-allow is set`)
		unknown     = fs.String("unknown-outcome", string(executor.UnknownHold), "an attempt whose outcome is lost and cannot be looked up: hold (for an operator) or resend (only where the destination dedups)")
		concurrency = fs.Int("adapter-concurrency", executor.DefaultConcurrency, "intents executed at once, per adapter")
		maxAttempts = fs.Int("max-attempts", executor.DefaultMaxAttempts, "execution attempts before a retryable error fails the intent (or, where an attempt's outcome was unknown, holds it unknown)")
		maxRetryAft = fs.Duration("max-retry-after", executor.DefaultMaxRetryAfter, "a destination's Retry-After is honoured up to this long; a longer one waits this long")
		intentRet   = fs.Duration("intent-retention", outbox.DefaultSweepMaxAge, "delete completed intents this long after completion (unknown intents are kept for an operator); operation ids dedup this long, so it must be at least --key-retention")
		keyRet      = fs.Duration("key-retention", idempotency.DefaultRetention, "forget completed idempotency keys this long after completion")
		lockTimeout = fs.Duration("idempotency-lock-timeout", idempotency.DefaultLockTimeout, "an attempt that owns an idempotency key this long without an outcome counts as abandoned (crashed): the next attempt looks the outcome up first; must be more than twice --execute-timeout")
		groupCommit = fs.Bool("idempotency-group-commit", true, "concurrent attempts share the durable transactions that begin and complete them (same guarantees, one commit per batch); false: one transaction each")
		execTimeout = fs.Duration("execute-timeout", executor.DefaultExecuteTimeout, "bound on one effect's execution (an SMTP send, a file publication)")
		ackWait     = fs.Duration("ack-wait", 0, "how long NATS waits for an adapter's ack before it delivers the message again (after a crash, the redelivery finishes the intent); 0: twice --execute-timeout, at least 1m; must exceed --execute-timeout")
		settle      = fs.Duration("lookup-settle", executor.DefaultLookupSettle, "a result lookup that finds nothing is trusted as proof the effect did not happen only this long after the attempt's last I/O with the destination (until then the intent waits, its key held); size it above the longest delay with which the destination shows an effect")

		metricsAddr = fs.String("metrics-addr", "", "serve Prometheus /metrics and the probes, without a token, on this loopback address, e.g. 127.0.0.1:9090 (default: off); another address needs --metrics-allow-remote")
		metricsRem  = fs.Bool("metrics-allow-remote", false, "let --metrics-addr be an address that is not loopback (and answer any Host): whoever reaches it reads the metrics and the readiness checks")
		adminAddr   = fs.String("admin-addr", "", "serve the admin API and pages on this address, e.g. 127.0.0.1:8080 (default: off)")
		tlsCert     = fs.String("tls-cert", "", "serve the admin API and pages over HTTPS with this certificate (PEM), with --tls-key")
		tlsKey      = fs.String("tls-key", "", "the --tls-cert certificate's key (PEM)")
		insecHTTP   = fs.Bool("insecure-http", false, "allow plain HTTP on an --admin-addr that is not loopback (behind a TLS-terminating proxy); otherwise such an address needs --tls-cert")
		tokensFile  = fs.String("tokens-file", "", "admin API tokens file, name:role:token per line or a JSON array (default $GATEWAY_TOKENS_FILE; without a file, the tokens of $"+admin.EnvTokens+"; a warning when group or world can read the file)")
		namespace   = fs.String("namespace", "", "the deployment's namespace on NATS; must be the one recorded in the database (gateway migrate --namespace), which is used when this is empty")
		keyScope    = fs.String("key-scope", string(outbox.KeyScopeGlobal), `idempotency keys of the intake: global (unique per kind) or resource (the effective key is "<bytes of the resource>:<resource>/<key>", so a worker cannot claim another resource's keys)`)
		leaseLockTO = lockTimeoutFlag(fs, "the intake's grants and enqueues answer 503 busy")
		failoverJmp = failoverJumpFlag(fs)
		newLogger   = a.logFlags(fs)

		allowFsyncOff = a.fsyncFlag(fs)
		printConfig   = fs.Bool("print-config", false, "print the effective configuration (command line, environment, defaults) as one JSON object, secrets redacted, and exit")
		dbMaxConns    = fs.Int("db-max-conns", 0, "connections of the database pool at most; 0 sizes it from what the process runs (see gateway.Config.PoolSize; 35 with the defaults); a pool_max_conns in the database URL wins")
	)
	// Each built-in adapter's flags, defined in its own file (adapter_*.go).
	adapterFlags := make([]adapterFlags, len(builtinAdapters))
	for i, b := range builtinAdapters {
		adapterFlags[i] = b.flags(fs)
	}
	if code, ok := a.parseWithEnv(fs, args); !ok {
		return code
	}
	if err := noArgs(fs); err != nil {
		return a.fail(err)
	}
	if *printConfig {
		return a.printConfig(fs)
	}
	logger, err := newLogger()
	if err != nil {
		return a.fail(err)
	}
	// Before any of them is read or checked: a file of secrets others may
	// read is said at once, whatever else is wrong with it.
	for _, f := range []struct{ path, field string }{
		{*natsCreds, "nats_creds"}, {*natsNKey, "nats_nkey"}, {*natsTLSKey, "nats_tls_key"}, {*tlsKey, "tls_key"},
	} {
		if f.path != "" {
			warnReadable(f.path, f.field, logger)
		}
	}
	for _, f := range adapterFlags {
		if s, ok := f.(secretFiler); ok {
			for _, sf := range s.secretFiles() {
				warnReadable(sf.path, sf.field, logger)
			}
		}
	}
	list := *adapterList
	if !flagSet(fs, "adapters") {
		for i, f := range adapterFlags {
			if o, ok := f.(optIn); ok && o.optedIn() {
				list += "," + builtinAdapters[i].kind
			}
		}
	}
	runs, own, err := a.parseAdapters(list)
	if err != nil {
		return a.fail(err)
	}
	tokens, err := loadTokens(*tokensFile, a.getenv, logger)
	if err != nil {
		return a.fail(err)
	}
	scope, err := outbox.ParseKeyScope(*keyScope)
	if err != nil {
		return a.fail(badInput("key_scope", "--key-scope "+err.Error()))
	}

	cfg := gateway.Config{
		Schema:  a.schema(),
		NATSURL: *natsURL,
		NATSAuth: gateway.NATSAuth{CredsFile: *natsCreds, NKeyFile: *natsNKey,
			TLSCAFile: *natsTLSCA, TLSCertFile: *natsTLSCert, TLSKeyFile: *natsTLSKey},
		NATSPingInterval: given(*natsPing),
		Runtime: executor.Config{
			Concurrency:    given(*concurrency),
			MaxAttempts:    given(*maxAttempts),
			MaxRetryAfter:  given(*maxRetryAft),
			ExecuteTimeout: given(*execTimeout),
			AckWait:        *ackWait, // 0: derived from ExecuteTimeout
			Unknown:        executor.UnknownPolicy(*unknown),
			LookupSettle:   given(*settle),
		},
		Idempotency: idempotency.Config{LockTimeout: given(*lockTimeout), Retention: *keyRet, GroupCommit: *groupCommit},
		Retention:   outbox.SweeperConfig{MaxAge: *intentRet},
		MetricsAddr: *metricsAddr, MetricsAllowRemote: *metricsRem,
		AdminAddr:    *adminAddr,
		AdminTLSCert: *tlsCert, AdminTLSKey: *tlsKey, AdminInsecureHTTP: *insecHTTP,
		Tokens:    tokens,
		KeyScope:  scope,
		Namespace: *namespace,
		Logger:    logger,
	}
	if *runDispatcher {
		cfg.Dispatcher = &dispatcher.Config{
			ID:              *dispatcherID,
			BatchSize:       *batchSize,
			MaxInFlight:     *maxInFlight,
			ClaimTTL:        *claimTTL,
			RelayTimeout:    *relayTimeout,
			PollInterval:    *pollInterval,
			PublishTimeout:  *pubTimeout,
			StreamReplicas:  *replicas,
			DuplicateWindow: *dupWindow,
			StreamMaxAge:    *streamMaxAge,
		}
	}
	// The gateway's registry, which the adapters' own metrics go on too.
	cfg.Registry = gateway.NewRegistry()
	env := adapterEnv{log: logger, registry: cfg.Registry, unknown: cfg.Runtime.Unknown}
	// The adapters: the built-in ones --adapters chose, made once the
	// database is reachable (until then each stands in as its kind), then
	// the program's own (Options.Adapters), those not chosen for the intake
	// only, then gateway bench's no-op one.
	for i, b := range builtinAdapters {
		if runs[i] {
			cfg.Adapters = append(cfg.Adapters, standIn(b.kind))
		}
	}
	cfg.Adapters = append(cfg.Adapters, own...)
	if h := a.runHooks; h != nil {
		cfg.Adapters = append(cfg.Adapters, h.Adapters...)
	}
	// The built-in adapters this process does not run, whose intake rules
	// its flags give (a relay serving the intake with the deployment's
	// shared settings): intake only, no executor (intakeRuler). After the
	// stand-ins, which keep their places at the start.
	for i, b := range builtinAdapters {
		r, ok := adapterFlags[i].(intakeRuler)
		if runs[i] || !ok || slices.ContainsFunc(cfg.Adapters, func(reg adapters.Registration) bool { return reg.Kind == b.kind }) {
			continue
		}
		spec, given, err := r.intake(func(name string) bool { return flagSet(fs, name) })
		if err != nil {
			return a.fail(err)
		}
		if given {
			cfg.Adapters = append(cfg.Adapters, adapters.Registration{Kind: b.kind, Spec: spec})
		}
	}
	if err := checkLockTimeout(*leaseLockTO); err != nil {
		return a.fail(err)
	}
	if err := checkFailoverJump(*failoverJmp); err != nil {
		return a.fail(err)
	}
	cfg.IssuerOptions = []lease.Option{lease.WithLockTimeout(*leaseLockTO), lease.WithFailoverEpochJump(*failoverJmp)}
	cfg.EnqueueLockTimeout = outboxLockTimeout(*leaseLockTO)
	if *dbMaxConns < 0 {
		return a.fail(badInput("db_max_conns", "--db-max-conns must be 0 (sized automatically) or more"))
	}
	// Flags are checked before anything is connected: a bad value is exit 2
	// whether or not the database is reachable. The rules are the
	// components' (gateway.Config.Validate); their errors name Go fields,
	// which flagError turns into the flags that set them.
	if err := cfg.Validate(); err != nil {
		return a.fail(flagError(err))
	}
	for i, f := range adapterFlags {
		if err := f.check(env, runs[i]); err != nil {
			return a.fail(err)
		}
	}
	for i, f := range adapterFlags {
		if l, ok := f.(lastChecker); ok {
			if err := l.checkLast(env, runs[i]); err != nil {
				return a.fail(err)
			}
		}
	}
	pool, err := a.connectSized(ctx, *dbURL, cmp.Or(int32(min(*dbMaxConns, math.MaxInt32)), cfg.PoolSize()))
	if err != nil {
		return a.fail(err)
	}
	defer pool.Close()
	if err := a.requireFsync(ctx, pool, *allowFsyncOff); err != nil {
		return a.fail(err)
	}
	cfg.Pool = pool
	// Behind a pooler in transaction mode the LISTEN connections (the
	// relay's, the intake's outcome waiter's) go to --database-direct-url,
	// or nothing LISTENs and both poll (gateway.Config.TransactionPooler).
	cfg.TransactionPooler = transactionPooled(pool)
	listen, err := a.listenPool(ctx, pool)
	if err != nil {
		return a.fail(err)
	}
	if listen != nil {
		defer listen.Close()
		cfg.ListenPool = listen
	}
	var running []string
	for i, b := range builtinAdapters {
		if !runs[i] {
			continue
		}
		r, err := adapterFlags[i].registration(ctx, env)
		if err != nil {
			return a.fail(err)
		}
		cfg.Adapters[len(running)] = r // its stand-in's place
		running = append(running, b.kind)
	}

	s, err := gateway.Start(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			// SIGTERM while starting (adapters wait for the stream until
			// then): nothing was left running, and stopping is what was asked.
			logger.Info("gateway: stopped before running", "component", "gateway", "error", err)
			return exitOK
		}
		return a.fail(flagError(err))
	}
	if h := a.runHooks; h != nil && h.Started != nil {
		h.Started(pool)
	}

	logger.Info("gateway: running", "component", "gateway", "dispatcher", cfg.Dispatcher != nil,
		"adapters", strings.Join(running, ","), "nats_url", redactNATS(cfg.NATSURL),
		"db_max_conns", pool.Config().MaxConns, "database_query_mode", queryModeName(pool.Config().ConnConfig.DefaultQueryExecMode),
		"listen", listenSource(cfg))
	bound := stopBound(cfg)
	select {
	case <-ctx.Done():
		logger.Info("gateway: stopping", "component", "gateway", "in_flight", len(s.InFlight()), "bound", bound)
	case <-s.Stopped():
		logger.Error("gateway: a component stopped unexpectedly; stopping the rest", "component", "gateway", "which", s.Cause())
		s.Stop()
		return exitInternal
	}

	done := make(chan struct{})
	go func() { s.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(bound):
		// Each execution left running may have reached its destination:
		// named, so that an operator knows which intents wait (their keys
		// stay owned until --idempotency-lock-timeout, then the next
		// attempt looks the outcome up or holds it unknown).
		left := s.InFlight()
		logger.Error("gateway: components did not stop in time", "component", "gateway", "timeout", bound, "in_flight", len(left))
		for _, f := range left {
			logger.Error("gateway: abandoning an execution in flight; its outcome is not recorded, the next attempt after the key's lock looks it up",
				"component", "gateway", "intent_id", f.IntentID, "kind", f.Kind, "running", time.Since(f.Since).Round(time.Millisecond))
		}
		return exitInternal
	}
	logger.Info("gateway: stopped", "component", "gateway")
	return exitOK
}

// listenSource says where the gateway's LISTEN connections go, for the
// "gateway: running" line: database-direct-url, database-url, or none
// (polling).
func listenSource(cfg gateway.Config) string {
	switch {
	case cfg.ListenPool != nil:
		return "database-direct-url"
	case cfg.TransactionPooler:
		return "none (polling)"
	}
	return "database-url"
}

// loadTokens reads the admin API's tokens from --tokens-file when given,
// else from $GATEWAY_TOKENS; none when neither is set. Errors name the
// source, never a secret.
func loadTokens(file string, getenv func(string) string, log *slog.Logger) ([]admin.Token, error) {
	if file != "" {
		warnReadable(file, "tokens_file", log)
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

// readSecretFile reads a secret held in a file: its first line, without
// the line end. It warns when group or world can read the file.
func readSecretFile(path string, log *slog.Logger) (string, error) {
	warnReadable(path, "smtp_password_file", log)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSuffix(line, "\r")
	if line == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return line, nil
}

// warnReadable logs a warning when a file holding secrets can be read by
// its group or by everyone (mode & 0o044): the secrets are then only as
// private as the least trusted local user. It names the file and its mode,
// never its content.
// secretFiler is an adapter's flags that name files of secrets, to be
// warned of when others may read them (warnReadable).
type secretFiler interface {
	secretFiles() []secretFile
}

type secretFile struct{ path, field string }

func warnReadable(path, field string, log *slog.Logger) {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm()&0o044 == 0 {
		return // a read error is reported by the read
	}
	log.Warn("gateway: a file holding secrets is readable by group or others; chmod 600 it",
		"component", "gateway", "field", field, "path", path, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
}

// parseAdapters parses --adapters: a comma-separated list of built-in kinds
// and the program's own (Options.Adapters with an executor); empty means
// none. It returns which built-in adapters run (by their index in
// builtinAdapters) and the program's registrations: those not chosen
// without their executor, so that the intake still accepts their kind.
func (a *app) parseAdapters(list string) ([]bool, []adapters.Registration, error) {
	var known []string
	for _, b := range builtinAdapters {
		known = append(known, b.kind)
	}
	for _, r := range a.adapters {
		if r.Executor != nil {
			known = append(known, r.Kind)
		}
	}
	runs := make([]bool, len(builtinAdapters))
	chosen := map[string]bool{}
	for k := range strings.SplitSeq(list, ",") {
		k = strings.TrimSpace(k)
		switch {
		case k == "":
			continue
		case !slices.Contains(known, k):
			return nil, nil, badInput("adapters", fmt.Sprintf("--adapters: unknown adapter %q (known: %s)", k, strings.Join(known, ", ")))
		case chosen[k]:
			return nil, nil, badInput("adapters", fmt.Sprintf("--adapters: %q given twice", k))
		}
		chosen[k] = true
		if i := slices.IndexFunc(builtinAdapters, func(b builtinAdapter) bool { return b.kind == k }); i >= 0 {
			runs[i] = true
		}
	}
	var own []adapters.Registration
	for _, r := range a.adapters {
		if !chosen[r.Kind] {
			r.Executor, r.Probe = nil, nil
		}
		own = append(own, r)
	}
	return runs, own, nil
}

// flagSet reports whether name was given, on the command line or as
// GATEWAY_<FLAG>.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// redactNATS hides credentials in a NATS URL list for logging.
func redactNATS(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		parts[i] = redactURL(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

// given is a flag's value for a Config field whose zero means "the
// default": on the command line 0 is a value, refused like any other
// value out of range, so it is passed as -1, which the component refuses
// with its own rule (and message).
func given[T ~int | ~int64](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// flagField is the flag of `gateway run` that sets a field of
// gateway.Config.
type flagField struct {
	// path is the field's path in gateway.Config, as an invalid-input
	// error names it ("Runtime.MaxAttempts").
	path string
	// flag is the flag's name, without "--".
	flag string
	// field is the JSON error's field when it is not the flag's name with
	// "_" for "-".
	field string
	// says is how a message names the field, when not "--<flag>".
	says string
	// bare: the component's message is the CLI's, without the flag before
	// it.
	bare bool
	// msg, when set, replaces the component's message.
	msg string
}

// fieldFlags maps the fields of a Config that flags set to those flags:
// the rules and their messages are the component's, the names the flags'.
// One row per field; the JSON error's field (the flag's name with "_") is
// the public contract.
type fieldFlags []flagField

// flagFields maps the fields of gateway.Config that gateway run's flags set
// to those flags, for flagError. Each built-in adapter's file has its own
// table for its Config (emailFields, …).
var flagFields = fieldFlags{
	{path: "Schema", flag: "schema"},
	{path: "Pool", flag: "database-url", bare: true},
	{path: "TransactionPooler", flag: "database-query-mode"},
	{path: "ListenPool", flag: "database-direct-url"},
	{path: "NATSURL", flag: "nats-url"},
	{path: "NATSPingInterval", flag: "nats-ping-interval"},
	{path: "NATSAuth.CredsFile", flag: "nats-creds"},
	{path: "NATSAuth.NKeyFile", flag: "nats-nkey"},
	{path: "NATSAuth.TLSCAFile", flag: "nats-tls-ca"},
	{path: "NATSAuth.TLSCertFile", flag: "nats-tls-cert"},
	{path: "NATSAuth.TLSKeyFile", flag: "nats-tls-key"},
	{path: "Dispatcher", flag: "dispatcher"},
	{path: "Dispatcher.ID", flag: "dispatcher-id"},
	{path: "Dispatcher.BatchSize", flag: "batch-size"},
	{path: "Dispatcher.MaxInFlight", flag: "max-in-flight"},
	{path: "Dispatcher.ClaimTTL", flag: "claim-ttl"},
	{path: "Dispatcher.RelayTimeout", flag: "relay-timeout"},
	{path: "Dispatcher.PollInterval", flag: "poll-interval"},
	{path: "Dispatcher.PublishTimeout", flag: "publish-timeout"},
	{path: "Dispatcher.StreamReplicas", flag: "stream-replicas"},
	{path: "Dispatcher.DuplicateWindow", flag: "duplicate-window"},
	{path: "Dispatcher.StreamMaxAge", flag: "stream-max-age"},
	{path: "Adapters", flag: "adapters", msg: "nothing to run: --dispatcher=false and --adapters is empty"},
	{path: "Runtime.Executors", flag: "adapters", bare: true},
	{path: "Runtime.Concurrency", flag: "adapter-concurrency"},
	{path: "Runtime.MaxAttempts", flag: "max-attempts"},
	{path: "Runtime.MaxRetryAfter", flag: "max-retry-after"},
	{path: "Runtime.ExecuteTimeout", flag: "execute-timeout"},
	{path: "Runtime.AckWait", flag: "ack-wait"},
	{path: "Runtime.LookupSettle", flag: "lookup-settle"},
	{path: "Runtime.Unknown", flag: "unknown-outcome"},
	{path: "Idempotency.LockTimeout", flag: "idempotency-lock-timeout"},
	{path: "Idempotency.Retention", flag: "key-retention"},
	{path: "Idempotency.GroupCommit", flag: "idempotency-group-commit"},
	{path: "Retention.MaxAge", flag: "intent-retention"},
	{path: "MetricsAddr", flag: "metrics-addr"},
	{path: "MetricsAllowRemote", flag: "metrics-allow-remote"},
	{path: "AdminAddr", flag: "admin-addr"},
	{path: "AdminTLSCert", flag: "tls-cert"},
	{path: "AdminTLSKey", flag: "tls-key"},
	{path: "AdminInsecureHTTP", flag: "insecure-http"},
	{path: "Tokens", flag: "tokens-file", field: "tokens", says: "--tokens-file or $" + admin.EnvTokens, bare: true},
	{path: "Namespace", flag: "namespace"},
	{path: "KeyScope", flag: "key-scope"},
}

// fieldNames matches the Go field names and paths a component's message
// may name ("ExecuteTimeout", "Runtime.ExecuteTimeout").
var fieldNames = regexp.MustCompile(`\b[A-Z][A-Za-z0-9]*(\.[A-Z][A-Za-z0-9]*)*\b`)

// flagError turns an invalid-input error naming a field of gateway.Config
// into one naming the flag that sets it (flagFields.flagError).
func flagError(err error) error { return flagFields.flagError(err) }

// flagError turns an invalid-input error naming a field of t's Config
// into one naming the flag that sets it: the JSON error's field is the
// flag's (max_attempts), and the message names flags where the
// component's names fields ("--idempotency-lock-timeout must be more than
// twice --execute-timeout"). Other errors pass as they are.
func (t fieldFlags) flagError(err error) error {
	var inv *fenceerr.InvalidError
	if !errors.As(err, &inv) {
		return err
	}
	byPath := func(path string) (flagField, bool) {
		i := slices.IndexFunc(t, func(f flagField) bool { return f.path == path })
		if i < 0 {
			return flagField{}, false
		}
		return t[i], true
	}
	f, ok := byPath(inv.Field)
	if !ok {
		// A program's own registration (Adapters[2]): its field, the
		// component's whole message.
		base, _, indexed := strings.Cut(inv.Field, "[")
		if f, ok = byPath(base); !ok || !indexed {
			return err
		}
		return badInput(f.jsonField(), inv.Field+": "+inv.Message)
	}
	if f.msg != "" {
		return badInput(f.jsonField(), f.msg)
	}
	// The message's field names, by their path or relative to the error's
	// component ("ExecuteTimeout" in a Runtime error), become flags.
	prefix := ""
	if i := strings.LastIndex(inv.Field, "."); i >= 0 {
		prefix = inv.Field[:i+1]
	}
	msg := fieldNames.ReplaceAllStringFunc(inv.Message, func(name string) string {
		if g, ok := byPath(name); ok {
			return g.names()
		}
		if g, ok := byPath(prefix + name); ok {
			return g.names()
		}
		return name
	})
	if f.bare {
		return badInput(f.jsonField(), msg)
	}
	return badInput(f.jsonField(), f.names()+" "+msg)
}

// jsonField is the JSON error's field.
func (f flagField) jsonField() string {
	return cmp.Or(f.field, strings.ReplaceAll(f.flag, "-", "_"))
}

// names is how a message names the field.
func (f flagField) names() string { return cmp.Or(f.says, "--"+f.flag) }
