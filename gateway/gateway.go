// Package gateway is fencegate's composition root: the relay (dispatcher),
// the adapter runtime with its adapters, the idempotency store and both
// sweepers, the admin API and pages, and the metrics server, wired from one
// Config and started in dependency order. `gateway run` and `gateway dev`
// are this package behind flags; a program of its own runs the same:
//
//	f, err := file.New(file.Config{Root: "/srv/reports"})
//	if err != nil {
//		return err
//	}
//	g, err := gateway.New(pool, nc, gateway.Config{Dispatcher: &dispatcher.Config{},
//		Adapters: []adapters.Registration{f.Registration()}})
//	if err != nil {
//		return err // bad configuration, naming the field
//	}
//	if err := g.Start(ctx); err != nil {
//		return err
//	}
//	defer g.Stop()
//	select {
//	case <-ctx.Done():
//	case <-g.Stopped(): // a component died; g.Cause() names it
//	}
package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/buildinfo"
	"github.com/fencegate/fencegate/internal/deployment"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/httpserver"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/migrations"
	"github.com/fencegate/fencegate/outbox"
)

// New checks cfg and returns a Gateway to Start, on pool (required; not
// closed by Stop) and nc (nil: Start dials cfg.NATSURL and Stop closes the
// connection; a given nc is not closed). It connects to nothing. A bad
// Config is a *fenceerr.InvalidError naming the field's path (Validate).
func New(pool *pgxpool.Pool, nc *nats.Conn, cfg Config) (*Gateway, error) {
	if pool != nil {
		cfg.Pool = pool
	}
	if nc != nil {
		cfg.NC = nc
	}
	if cfg.Pool == nil {
		return nil, errors.New("gateway: no pool")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Gateway{cfg: cfg, stopping: make(chan struct{}), died: make(chan struct{})}, nil
}

// Start starts the configured components in dependency order — NATS
// connection, metrics server, admin server, dispatcher, intent sweeper,
// idempotency sweeper, adapter runtime — and returns once they run. The
// adapter runtime waits for the stream (which a dispatcher creates) until
// ctx ends. On error, whatever was started is stopped again and the Gateway
// is done. A second Start is an error (startstop.ErrStarted).
//
// ctx only bounds starting: the components run until Stop, so that
// Stopped means a component died, never that ctx ended.
func (s *Gateway) Start(ctx context.Context) error {
	s.mu.Lock()
	started := s.started
	s.started = true
	s.mu.Unlock()
	if started {
		return fmt.Errorf("gateway: %w", startstop.ErrStarted)
	}
	err := s.start(ctx)
	s.mu.Lock()
	s.startDone = true
	s.mu.Unlock()
	return err
}

// NewRegistry returns the registry a Gateway makes when Config.Registry is
// nil: a new one with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Start is New and Start in one call.
func Start(ctx context.Context, cfg Config) (*Gateway, error) {
	g, err := New(cfg.Pool, cfg.NC, cfg)
	if err != nil {
		return nil, err
	}
	if err := g.Start(ctx); err != nil {
		return nil, err
	}
	return g, nil
}

// MetricsAddr is the address the metrics server listens on; empty without.
func (s *Gateway) MetricsAddr() string { return s.metricsAddr }

// AdminAddr is the address the admin server listens on; empty without.
func (s *Gateway) AdminAddr() string { return s.adminAddr }

// Registry is the registry every component's metrics are on.
func (s *Gateway) Registry() *prometheus.Registry { return s.registry }

// Gateway is a running set of components started by Start.
type Gateway struct {
	cfg     Config
	started bool // under mu
	// startDone: Start returned (under mu), for /readyz.
	startDone bool
	log       *slog.Logger
	registry  *prometheus.Registry

	nc         *nats.Conn
	ns         wire.Namespace         // the deployment's, read at start
	dispatcher *dispatcher.Dispatcher // nil unless the relay runs
	outbox     *outbox.Client
	store      *idempotency.Store
	sweeper    *idempotency.Sweeper
	runtime    *adapters.Runtime // nil unless adapters run
	// consumers are the runtime's kinds and their durable consumers, for
	// /readyz. dispatcher, runtime and consumers are set under mu: the
	// metrics server answers /readyz while Start still starts them.
	consumers []consumer
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

// start does Start's work.
func (s *Gateway) start(ctx context.Context) (err error) {
	cfg := s.cfg
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registry
	if reg == nil {
		reg = NewRegistry()
	}
	// Which build runs; a registry that has it already (a program's own)
	// keeps its own.
	if err := reg.Register(buildinfo.Collector()); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return fmt.Errorf("gateway: register build info: %w", err)
		}
	}
	s.log, s.registry = log, reg
	dcfg, runsDispatcher := cfg.dispatcherConfig()
	if runsDispatcher {
		// The outbox's state for alerts (pending, relayed, failed, unknown
		// by kind, and the oldest's age), on the relay's processes: every
		// one reports the same database, so alert on max() across them.
		if err := reg.Register(newIntentCollector(cfg.Pool, pgschema.MustParse(cfg.Schema), log)); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return fmt.Errorf("gateway: register intent metrics: %w", err)
			}
		}
	}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	runCtx := context.WithoutCancel(ctx)

	// The namespace before NATS: every name the dispatcher and the adapters
	// use on NATS carries it.
	if runsDispatcher || cfg.runsAdapters() {
		info, err := deployment.Resolve(ctx, cfg.Pool, cfg.Schema)
		if errors.Is(err, deployment.ErrNotMigrated) {
			// Not migrated here; an install from before schemas in
			// public is named (never a second, empty install).
			if _, ierr := migrations.Installed(ctx, cfg.Pool, cfg.Schema); ierr != nil {
				return invalid("Schema", "%s", ierr)
			}
			return invalid("Pool", "%s", err)
		}
		if err != nil {
			return err
		}
		if cfg.Namespace != "" && cfg.Namespace != string(info.Namespace) {
			return invalid("Namespace", "%q is not this database's namespace %q (set it with gateway migrate --namespace)", cfg.Namespace, info.Namespace)
		}
		s.ns = info.Namespace
		log.Info("gateway: namespace", "component", "gateway", "namespace", s.ns, "explicit", info.Explicit, "stream", s.ns.Stream())
	}

	// NATS first: both the dispatcher and the adapters use it.
	s.nc = cfg.NC
	if s.nc == nil {
		natsURL := cmp.Or(cfg.NATSURL, DefaultNATSURL)
		nc, err := dialNATS(natsURL, cfg.NATSAuth, cmp.Or(cfg.NATSPingInterval, DefaultNATSPingInterval), log)
		if errors.Is(err, fenceerr.ErrInvalid) {
			return err
		}
		if err != nil {
			return invalid("NATSURL", "cannot be used: %s", errmap.OneLine(err.Error()))
		}
		s.nc = nc
		s.add(part{name: "nats", stop: nc.Close})
	}

	// The metrics server before the components that may wait (the adapter
	// runtime waits for the stream): it answers meanwhile.
	if cfg.MetricsAddr != "" {
		if err := s.serveMetrics(cfg.MetricsAddr); err != nil {
			return err
		}
	}

	if err := s.clients(cfg, log, reg); err != nil {
		return err
	}
	// The admin server early too: /healthz answers while adapters wait.
	if cfg.AdminAddr != "" {
		if err := s.serveAdmin(cfg, log, reg); err != nil {
			return err
		}
	}

	if runsDispatcher {
		if dcfg.Registerer == nil {
			dcfg.Registerer = reg
		}
		dcfg.Logger = cmp.Or(dcfg.Logger, log)
		dcfg.Namespace = string(s.ns)
		dcfg.Schema = cfg.Schema
		d, err := dispatcher.New(cfg.Pool, s.nc, dcfg)
		if err != nil {
			return within("Dispatcher", err)
		}
		// Started before the adapters: it creates the stream they wait for.
		if err := d.Start(runCtx); err != nil {
			return err
		}
		s.mu.Lock()
		s.dispatcher = d
		s.mu.Unlock()
		s.add(part{name: "dispatcher", stop: d.Stop, stopped: d.Stopped()})

		// Retention: completed intents older than their age go, in small
		// batches (SKIP LOCKED: several processes may sweep at once).
		rcfg := cfg.sweeperConfig()
		rcfg.Logger = cmp.Or(rcfg.Logger, log)
		rcfg.Schema = cfg.Schema
		sw, err := outbox.NewSweeper(cfg.Pool, rcfg)
		if err != nil {
			return within("Retention", err)
		}
		if err := sw.Start(runCtx); err != nil {
			return err
		}
		s.add(part{name: "intent_sweeper", stop: sw.Stop, stopped: sw.Stopped()})
	}

	if cfg.runsAdapters() {
		if err := s.startAdapters(ctx, cfg, log, reg); err != nil {
			return err
		}
	}
	return nil
}

// startAdapters probes the adapters and starts the idempotency sweeper and
// the adapter runtime.
func (s *Gateway) startAdapters(ctx context.Context, cfg Config, log *slog.Logger, reg *prometheus.Registry) error {
	var execs []adapters.Executor
	for _, r := range cfg.Adapters {
		if r.Executor == nil {
			continue
		}
		// Before anything is consumed: a destination that does not keep
		// what its adapter relies on must stop the start, not the first
		// effect.
		if r.Probe != nil {
			if err := r.Probe(ctx); err != nil {
				if m := errmap.Map(err); m.Code == errmap.InvalidInput {
					return m
				}
				return errmap.New(errmap.Unavailable, r.Kind+": "+errmap.OneLine(err.Error()))
			}
		}
		execs = append(execs, r.Executor)
	}

	store, ob := s.store, s.outbox

	rcfg := cfg.runtimeConfig()
	rcfg.Executors = execs
	if rcfg.Registerer == nil {
		rcfg.Registerer = reg
	}
	rcfg.Logger = cmp.Or(rcfg.Logger, log)
	rcfg.Namespace = string(s.ns)
	rcfg.Schema = cfg.Schema
	rt, err := adapters.NewRuntime(cfg.Pool, s.nc, store, ob, rcfg)
	if err != nil {
		return within("Runtime", err)
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
	s.mu.Lock()
	s.runtime = rt
	for _, e := range execs {
		s.consumers = append(s.consumers, consumer{kind: e.Kind(), durable: rt.Durable(e.Kind())})
	}
	s.mu.Unlock()
	// Stopped last: in-flight executions finish before the sweeper, the
	// dispatcher and the NATS connection go.
	s.add(part{name: "adapters", stop: rt.Stop, stopped: rt.Stopped()})
	return nil
}

// clients makes the idempotency store and the outbox client the adapters
// and the admin server share.
func (s *Gateway) clients(cfg Config, log *slog.Logger, reg *prometheus.Registry) error {
	icfg := cfg.Idempotency
	icfg.Logger = cmp.Or(icfg.Logger, log)
	icfg.Schema = cfg.Schema
	if icfg.Registerer == nil {
		icfg.Registerer = reg
	}
	store, err := idempotency.New(cfg.Pool, icfg)
	if err != nil {
		return within("Idempotency", err)
	}
	s.store = store
	// The intake knows each adapter's rules (a mail policy, a target
	// policy, an allow-list): a payload outside them is refused at
	// enqueue, naming the field, instead of failing later.
	kinds := outbox.DefaultKinds()
	for _, r := range cfg.Adapters {
		kinds[r.Kind] = r.Spec
	}
	ob, err := outbox.New(cfg.Pool, outbox.Config{Schema: cfg.Schema, Kinds: kinds, KeyScope: cfg.KeyScope, Logger: log, Registerer: s.registry})
	if err != nil {
		return err
	}
	s.outbox = ob
	return nil
}

// Namespace is the deployment's namespace on NATS, read from the database
// at start (empty before, or when the process runs neither the relay nor
// adapters).
func (s *Gateway) Namespace() string { return string(s.ns) }

// serveAdmin starts the admin API and pages on cfg.AdminAddr. Its /readyz
// is the gateway's (readyz).
func (s *Gateway) serveAdmin(cfg Config, log *slog.Logger, reg *prometheus.Registry) error {
	acfg := admin.Config{
		Pool:     cfg.Pool,
		Outbox:   s.outbox,
		Issuer:   lease.NewIssuer(cfg.Pool, append([]lease.Option{lease.WithRegisterer(reg), lease.WithSchema(cfg.Schema)}, cfg.IssuerOptions...)...),
		Store:    s.store,
		Tokens:   cfg.Tokens,
		Registry: reg,
		Logger:   log,

		TLSCertFile: cfg.AdminTLSCert, TLSKeyFile: cfg.AdminTLSKey, InsecureHTTP: cfg.AdminInsecureHTTP,
	}
	// One readiness for the process: the admin address's /readyz is the
	// metrics address's (probe.go), every part this process runs.
	acfg.Ready = http.HandlerFunc(s.readyz)
	srv, err := admin.New(acfg)
	var tlsErr *admin.TLSError
	if errors.As(err, &tlsErr) {
		return invalid("AdminTLSCert", "and AdminTLSKey: %s", errmap.OneLine(tlsErr.Err.Error()))
	}
	if err != nil {
		return invalid("Tokens", "%s", errmap.OneLine(err.Error()))
	}
	ln, err := srv.Listen(cfg.AdminAddr)
	if err != nil {
		return invalid("AdminAddr", "cannot be listened on: %s", errmap.OneLine(err.Error()))
	}
	// The admin server's own lifecycle (startstop): Start returns once it
	// serves, Stop shuts it down and waits, Stopped closes if it ends on
	// its own (watched by add).
	if err := srv.Start(context.Background(), ln); err != nil {
		_ = ln.Close()
		return err
	}
	go func() {
		<-srv.Stopped()
		if err := srv.Err(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("gateway: admin server", "component", "gateway", "error", err)
		}
	}()
	s.adminAddr = ln.Addr().String()
	s.add(part{name: "admin", stopped: srv.Stopped(), stop: srv.Stop})
	scheme := "http"
	if cfg.AdminTLSCert != "" {
		scheme = "https"
	}
	log.Info("gateway: serving the admin API and pages", "component", "gateway", "addr", s.adminAddr,
		"url", scheme+"://"+s.adminAddr+"/", "tokens", len(cfg.Tokens))
	return nil
}

// serveMetrics starts the Prometheus /metrics server.
func (s *Gateway) serveMetrics(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return invalid("MetricsAddr", "cannot be listened on: %s", errmap.OneLine(err.Error()))
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry}))
	// Probes on every process, whatever it runs (an adapter-only process
	// has no admin server): /healthz while the process serves, /readyz from
	// each component's own state (probe.go).
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	srv := httpserver.New(mux, s.log)
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
func (s *Gateway) add(p part) {
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
// (if the gateway dialled it) closes. Safe to call more than once.
func (s *Gateway) Stop() {
	s.mu.Lock()
	s.started = true // no Start after Stop
	s.mu.Unlock()
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
func (s *Gateway) Stopped() <-chan struct{} { return s.died }

// Cause names the component whose stop closed Stopped, or "".
func (s *Gateway) Cause() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.diedPart
}

// Outbox is the outbox client the gateway's components share.
func (s *Gateway) Outbox() *outbox.Client { return s.outbox }

// Store is the idempotency store the gateway's components share.
func (s *Gateway) Store() *idempotency.Store { return s.store }

// NATS is the gateway's NATS connection (Config.NC, or the one it dialled).
func (s *Gateway) NATS() *nats.Conn { return s.nc }

// Dispatcher is the running relay, nil unless Config.Dispatcher is set.
func (s *Gateway) Dispatcher() *dispatcher.Dispatcher { return s.dispatcher }

// Runtime is the running adapter runtime, nil unless adapters run.
func (s *Gateway) Runtime() *adapters.Runtime { return s.runtime }
