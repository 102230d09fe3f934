package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/internal/buildinfo"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/httpserver"
	"github.com/fencegate/fencegate/internal/pgschema"
)

// NewRegistry returns the registry a Gateway makes when Config.Registry is
// nil: a new one with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// registerMetrics registers the gateway's own collectors on reg: the
// build that runs and, on the relay's processes, the outbox's state. A
// registry that has one already (a program's own) keeps it.
func registerMetrics(reg *prometheus.Registry, pool *pgxpool.Pool, schema string, relay bool, log *slog.Logger) error {
	if err := reg.Register(buildinfo.Collector()); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return fmt.Errorf("gateway: register build info: %w", err)
		}
	}
	if relay {
		// The outbox's state for alerts (pending, relayed, failed, unknown
		// by kind, and the oldest's age), on the relay's processes: every
		// one reports the same database, so alert on max() across them.
		if err := reg.Register(newIntentCollector(pool, pgschema.MustParse(schema), log)); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return fmt.Errorf("gateway: register intent metrics: %w", err)
			}
		}
		// The refusals and grants of SQL and CLI workers, counted in
		// the database: they have no /metrics of their own.
		if err := reg.Register(newCounterCollector(pool, pgschema.MustParse(schema), log)); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return fmt.Errorf("gateway: register counter metrics: %w", err)
			}
		}
	}
	return nil
}

// serveMetrics starts the Prometheus /metrics server. It needs no token:
// unless allowRemote it listens on loopback only (checked again on the
// address bound, which a name like "localhost" decides) and answers only
// a loopback Host.
func (s *Gateway) serveMetrics(addr string, allowRemote bool) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return invalid("MetricsAddr", "cannot be listened on: %s", errmap.OneLine(err.Error()))
	}
	if !allowRemote && !admin.IsLoopbackAddr(ln.Addr().String()) {
		_ = ln.Close()
		return invalid("MetricsAddr", "%q is bound to %s, not a loopback address: give MetricsAllowRemote to serve it there", addr, ln.Addr())
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{Registry: s.registry}))
	// Probes on every process, whatever it runs (an adapter-only process
	// has no admin server): /healthz while the process serves, /readyz from
	// each component's own state (probe.go).
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	var h http.Handler = mux
	if !allowRemote {
		// A web page's DNS-rebinding name for 127.0.0.1 must not read the
		// metrics or the readiness checks' errors.
		h = admin.LoopbackHostOnly(mux)
	}
	srv := httpserver.New(h, s.log)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("gateway: metrics server", "component", "gateway", "error", err)
		}
	}()
	s.metricsAddr = ln.Addr().String()
	s.parts.Add("metrics", func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, done)
	s.log.Info("gateway: serving metrics", "component", "gateway", "addr", s.metricsAddr)
	return nil
}
