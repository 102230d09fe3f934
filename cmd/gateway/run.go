package main

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fencegate/fencegate/dispatcher"
)

// defaultNATSURL is used when neither --nats-url nor $GATEWAY_NATS_URL is set.
const defaultNATSURL = "nats://127.0.0.1:4222"

// stopTimeout bounds how long `gateway run` waits for its components to stop
// after SIGTERM/SIGINT before it gives up and exits 1.
const stopTimeout = 30 * time.Second

// cmdRun runs the relay (and later the adapters) until SIGTERM or SIGINT.
//
// Flags: --dispatcher (default true) runs the relay; --nats-url (default
// $GATEWAY_NATS_URL, else nats://127.0.0.1:4222); --batch-size,
// --max-in-flight, --claim-ttl, --relay-timeout, --poll-interval,
// --publish-timeout, --stream-replicas, --duplicate-window (dispatcher
// defaults when zero); --dispatcher-id (default host-pid-random);
// --metrics-addr serves Prometheus /metrics there (default empty: no
// metrics server; e.g. 127.0.0.1:9090); --log-level debug|info|warn|error.
// Logs go to stderr as slog text.
//
// On SIGTERM/SIGINT it stops claiming, waits for the PubAcks of what it
// published, marks those intents relayed, returns every other claim and
// exits 0.
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
		metricsAddr   = fs.String("metrics-addr", "", "serve Prometheus /metrics on this address, e.g. 127.0.0.1:9090 (default: off)")
		logLevel      = fs.String("log-level", "info", "log level: debug, info, warn, error")
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

	pool, err := a.connect(ctx, *dbURL)
	if err != nil {
		return a.fail(err)
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var nc *nats.Conn
	if *runDispatcher {
		nc, err = nats.Connect(*natsURL,
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
				logger.Warn("gateway: NATS disconnected", "component", "gateway", "error", err)
			}),
			nats.ReconnectHandler(func(c *nats.Conn) {
				logger.Info("gateway: NATS reconnected", "component", "gateway", "url", c.ConnectedUrlRedacted())
			}),
		)
		if err != nil {
			return a.fail(badInput("nats_url", "cannot use the NATS URL: "+oneLine(err.Error())))
		}
		defer nc.Close()
	}

	// Components start in dependency order and stop in reverse.
	var stops []func()
	stopAll := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}

	// testPause is a test hook (GATEWAY_TEST_PAUSE_BEFORE_MARK, a
	// duration): the dispatcher pauses after each batch's PubAcks and before
	// marking it relayed, so a test can kill the process with published
	// intents still claimed. Unset in production.
	var hooks dispatcher.Hooks
	if v := a.getenv("GATEWAY_TEST_PAUSE_BEFORE_MARK"); v != "" {
		pause, err := time.ParseDuration(v)
		if err != nil {
			return a.fail(badInput("GATEWAY_TEST_PAUSE_BEFORE_MARK", "not a duration: "+v))
		}
		hooks.Acked = func(string, []int64) { time.Sleep(pause) }
	}

	var stopped <-chan struct{}
	if *runDispatcher {
		d, err := dispatcher.New(pool, nc, dispatcher.Config{
			ID:              *dispatcherID,
			BatchSize:       *batchSize,
			MaxInFlight:     *maxInFlight,
			ClaimTTL:        *claimTTL,
			RelayTimeout:    *relayTimeout,
			PollInterval:    *pollInterval,
			PublishTimeout:  *pubTimeout,
			StreamReplicas:  *replicas,
			DuplicateWindow: *dupWindow,
			Registerer:      reg,
			Logger:          logger,
			Hooks:           hooks,
		})
		if err != nil {
			return a.fail(badInput("flags", err.Error()))
		}
		if err := d.Start(ctx); err != nil {
			return a.fail(err)
		}
		stops = append(stops, d.Stop)
		stopped = d.Stopped()
	}

	// ── Adapters start here. ──────────────────────────────────────────────
	// (--adapters, added with the adapter runtime: start them after the
	// dispatcher and append their Stop to stops, so they stop first.)

	if *metricsAddr != "" {
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			stopAll()
			return a.fail(badInput("metrics_addr", "cannot listen on --metrics-addr: "+oneLine(err.Error())))
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("gateway: metrics server", "component", "gateway", "error", err)
			}
		}()
		stops = append(stops, func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		})
		logger.Info("gateway: serving metrics", "component", "gateway", "addr", ln.Addr().String())
	}

	logger.Info("gateway: running", "component", "gateway", "dispatcher", *runDispatcher,
		"nats_url", redactNATS(*natsURL))
	select {
	case <-ctx.Done():
		logger.Info("gateway: stopping", "component", "gateway")
	case <-stopped:
		// Only a dispatcher's own failure ends it before ctx does.
		logger.Error("gateway: dispatcher stopped unexpectedly", "component", "gateway")
		stopAll()
		return exitInternal
	}

	done := make(chan struct{})
	go func() { stopAll(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopTimeout):
		logger.Error("gateway: components did not stop in time", "component", "gateway", "timeout", stopTimeout)
		return exitInternal
	}
	logger.Info("gateway: stopped", "component", "gateway")
	return exitOK
}

// redactNATS hides credentials in a NATS URL list for logging.
func redactNATS(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		parts[i] = redactURL(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}
