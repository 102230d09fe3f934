// Package gateway is fencegate's composition root: the relay (dispatcher),
// the adapter runtime with its adapters, the idempotency store and both
// sweepers, the admin API and pages, and the metrics server, wired from one
// Config (config.go) and started in dependency order as the parts of one
// startstop.Group (this file; nats.go, metrics.go, admin.go, adapters.go
// start theirs). `gateway run` and `gateway dev`
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
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/deployment"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/migrations"
	"github.com/fencegate/fencegate/outbox"
)

// New checks cfg and returns a Gateway to Start, on pool (required; not
// closed by Stop) and nc (nil: Start dials cfg.NATSURL and Stop closes the
// connection; a given nc is not closed). It connects to nothing. A bad
// Config, or no pool (pool nil and Config.Pool nil), is a
// *fenceerr.InvalidError naming the field's path (Validate; Pool).
func New(pool *pgxpool.Pool, nc *nats.Conn, cfg Config) (*Gateway, error) {
	if pool != nil {
		cfg.Pool = pool
	}
	if nc != nil {
		cfg.NC = nc
	}
	if cfg.Pool == nil {
		return nil, invalid("Pool", "is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Gateway{cfg: cfg}, nil
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

// Gateway is a running set of components started by Start.
type Gateway struct {
	cfg     Config
	started bool // under mu
	// stoppedFirst: Stop was called before Start (under mu); Start then
	// fails (startstop.ErrStoppedBeforeStart).
	stoppedFirst bool
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
	runtime    *executor.Runtime // nil unless adapters run
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

	// parts are the started components in start order: Stop stops them in
	// reverse, and the first that stops on its own closes Stopped.
	parts startstop.Group
	mu    sync.Mutex
}

// Start starts the configured components in dependency order — NATS
// connection, metrics server, admin server, dispatcher, intent sweeper,
// idempotency sweeper, adapter runtime — and returns once they run. The
// adapter runtime waits for the stream (which a dispatcher creates) until
// ctx ends. On error, whatever was started is stopped again and the Gateway
// is done. A second Start is an error (startstop.ErrStarted); so is a Start
// after a Stop that came first: the Gateway was stopped before it started
// (startstop.ErrStoppedBeforeStart).
//
// ctx only bounds starting: the components run until Stop, so that
// Stopped means a component died, never that ctx ended.
func (s *Gateway) Start(ctx context.Context) error {
	s.mu.Lock()
	started, stoppedFirst := s.started, s.stoppedFirst
	s.started = true
	s.mu.Unlock()
	switch {
	case stoppedFirst:
		return fmt.Errorf("gateway: %w", startstop.ErrStoppedBeforeStart)
	case started:
		return fmt.Errorf("gateway: %w", startstop.ErrStarted)
	}
	err := s.start(ctx)
	s.mu.Lock()
	s.startDone = true
	s.mu.Unlock()
	return err
}

// start does Start's work: the parts in start order, each added to
// s.parts once it runs.
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
	s.log, s.registry = log, reg
	dcfg, runsDispatcher := cfg.dispatcherConfig()
	if err := registerMetrics(reg, cfg.Pool, cfg.Schema, runsDispatcher, log); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()

	// The namespace before NATS: every name the dispatcher and the adapters
	// use on NATS carries it.
	if runsDispatcher || cfg.runsAdapters() {
		if err := s.resolveNamespace(ctx, cfg, log); err != nil {
			return err
		}
	}
	// NATS first: both the dispatcher and the adapters use it.
	if err := s.connectNATS(cfg, log); err != nil {
		return err
	}
	// The metrics server before the components that may wait (the adapter
	// runtime waits for the stream): it answers meanwhile.
	if cfg.MetricsAddr != "" {
		if err := s.serveMetrics(cfg.MetricsAddr, cfg.MetricsAllowRemote); err != nil {
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
	// The relay before the adapters: it creates the stream they wait for.
	if runsDispatcher {
		if err := s.startRelay(context.WithoutCancel(ctx), cfg, dcfg, log, reg); err != nil {
			return err
		}
	}
	// The adapters last: they stop first, so in-flight executions finish
	// before the sweeper, the dispatcher and the NATS connection go.
	if cfg.runsAdapters() {
		if err := s.startAdapters(ctx, cfg, log, reg); err != nil {
			return err
		}
	}
	return nil
}

// resolveNamespace reads the deployment's namespace from the database and
// checks it against Config.Namespace.
func (s *Gateway) resolveNamespace(ctx context.Context, cfg Config, log *slog.Logger) error {
	info, err := deployment.Resolve(ctx, cfg.Pool, cfg.Schema)
	if errors.Is(err, deployment.ErrNotMigrated) {
		// Not migrated here; an install from before schemas in
		// public is named (never a second, empty install).
		if _, ierr := migrations.Installed(ctx, cfg.Pool, cfg.Schema); ierr != nil {
			return invalid("Schema", "%s", ierr)
		}
		// The schema is what is wrong (not migrated, or not the one
		// fencegate was migrated into), not the pool.
		var nm *deployment.NotMigratedError
		if errors.As(err, &nm) {
			return invalid("Schema", "%q is not migrated in this database (it has no namespace yet): run gateway migrate --schema %s, or name the schema fencegate was migrated into", nm.Schema, nm.Schema)
		}
		return invalid("Schema", "%s", err)
	}
	if err != nil {
		return err
	}
	// The schema must be this build's: a migration it lacks may add what
	// this build's statements and functions use (a column, a signature),
	// which would fail later, mid-effect, and less clearly. One a newer
	// build applied is let through (a rollback to this build, the old
	// processes of a rolling upgrade), said once: what the newer schema
	// changed may fail.
	v, err := migrations.Compare(ctx, cfg.Pool, cfg.Schema)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		// A role that may not read the migrations' record (granted the
		// working tables only) cannot tell: said, not refused.
		log.Warn("gateway: cannot read the schema's migrations to compare them with this build's (permission denied); running unchecked",
			"component", "gateway", "schema", cmp.Or(cfg.Schema, pgschema.Default))
	case err != nil:
		return err
	}
	if len(v.Pending) > 0 {
		return invalid("Schema", "%s", v.Behind(cfg.Schema))
	}
	if len(v.Unknown) > 0 {
		log.Warn("gateway: the schema was migrated by a newer build; running, but what the newer schema changed may fail here: upgrade this process",
			"component", "gateway", "schema", cmp.Or(cfg.Schema, pgschema.Default), "newer_migrations", v.Unknown, "this_build_newest", migrations.Latest())
	}
	if cfg.Namespace != "" && cfg.Namespace != string(info.Namespace) {
		return invalid("Namespace", "%q is not this database's namespace %q (set it with gateway migrate --namespace)", cfg.Namespace, info.Namespace)
	}
	s.ns = info.Namespace
	log.Info("gateway: namespace", "component", "gateway", "namespace", s.ns, "explicit", info.Explicit, "stream", s.ns.Stream())
	return nil
}

// startRelay starts the dispatcher and the intent sweeper that runs with
// it; ctx does not end with Start's.
func (s *Gateway) startRelay(ctx context.Context, cfg Config, dcfg dispatcher.Config, log *slog.Logger, reg *prometheus.Registry) error {
	if dcfg.Registerer == nil {
		dcfg.Registerer = reg
	}
	dcfg.Logger = cmp.Or(dcfg.Logger, log)
	dcfg.Namespace = string(s.ns)
	dcfg.Schema = cfg.Schema
	dcfg.ListenPool = cmp.Or(dcfg.ListenPool, cfg.ListenPool)
	if dcfg.ListenPool == nil && cfg.TransactionPooler {
		dcfg.DisableListen = true
	}
	d, err := dispatcher.New(cfg.Pool, s.nc, dcfg)
	if err != nil {
		return within("Dispatcher", err)
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	s.dispatcher = d
	s.mu.Unlock()
	s.parts.Add("dispatcher", d.Stop, d.Stopped())

	// Retention: completed intents older than their age go, in small
	// batches (SKIP LOCKED: several processes may sweep at once).
	rcfg := cfg.sweeperConfig()
	rcfg.Logger = cmp.Or(rcfg.Logger, log)
	rcfg.Schema = cfg.Schema
	sw, err := outbox.NewSweeper(cfg.Pool, rcfg)
	if err != nil {
		return within("Retention", err)
	}
	if err := sw.Start(ctx); err != nil {
		return err
	}
	s.parts.Add("intent_sweeper", sw.Stop, sw.Stopped())
	return nil
}

// Stop stops every component in the reverse of their start order and
// returns when they have stopped: the adapters finish their in-flight
// executions, the dispatcher returns its claims, then the NATS connection
// (if the gateway dialled it) closes. Safe to call more than once.
func (s *Gateway) Stop() {
	s.mu.Lock()
	if !s.started {
		s.stoppedFirst = true // no Start after Stop
	}
	s.mu.Unlock()
	s.parts.StopAll()
}

// Stopped is closed when a component stopped without Stop being called
// (a dispatcher's own failure, the metrics server failing). The caller
// should then Stop the rest and exit non-zero.
func (s *Gateway) Stopped() <-chan struct{} { return s.parts.Died() }

// Cause names the component whose stop closed Stopped, or "".
func (s *Gateway) Cause() string { return s.parts.Cause() }

// MetricsAddr is the address the metrics server listens on; empty without.
func (s *Gateway) MetricsAddr() string { return s.metricsAddr }

// AdminAddr is the address the admin server listens on; empty without.
func (s *Gateway) AdminAddr() string { return s.adminAddr }

// Registry is the registry every component's metrics are on.
func (s *Gateway) Registry() *prometheus.Registry { return s.registry }

// Namespace is the deployment's namespace on NATS, read from the database
// at start (empty before, or when the process runs neither the relay nor
// adapters).
func (s *Gateway) Namespace() string { return string(s.ns) }

// Outbox is the outbox client the gateway's components share.
func (s *Gateway) Outbox() *outbox.Client { return s.outbox }

// Store is the idempotency store the gateway's components share.
func (s *Gateway) Store() *idempotency.Store { return s.store }

// NATS is the gateway's NATS connection (Config.NC, or the one it dialled).
func (s *Gateway) NATS() *nats.Conn { return s.nc }

// Dispatcher is the running relay, nil unless Config.Dispatcher is set.
func (s *Gateway) Dispatcher() *dispatcher.Dispatcher { return s.dispatcher }

// Runtime is the running adapter runtime, nil unless adapters run.
func (s *Gateway) Runtime() *executor.Runtime { return s.runtime }

// InFlight returns the deliveries the adapters are handling now (none
// without adapters): what a stop that gives up waiting leaves behind.
func (s *Gateway) InFlight() []executor.InFlightIntent {
	s.mu.Lock()
	rt := s.runtime
	s.mu.Unlock()
	if rt == nil {
		return nil
	}
	return rt.InFlight()
}
