package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/lease"
)

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
	// One readiness for the process: the admin address's /readyz checks
	// what the metrics address's does (probe.go), every part this process
	// runs, without the errors' text.
	acfg.Ready = http.HandlerFunc(s.adminReadyz)
	srv, err := admin.New(acfg)
	var tlsErr *admin.TLSError
	if errors.As(err, &tlsErr) {
		return invalid("AdminTLSCert", "and AdminTLSKey: %s", errmap.OneLine(tlsErr.Err.Error()))
	}
	if err != nil {
		// Validate checked the tokens and the TLS files already.
		return fmt.Errorf("gateway: admin server: %w", err)
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
	s.parts.Add("admin", srv.Stop, srv.Stopped())
	scheme := "http"
	if cfg.AdminTLSCert != "" {
		scheme = "https"
	}
	log.Info("gateway: serving the admin API and pages", "component", "gateway", "addr", s.adminAddr,
		"url", scheme+"://"+s.adminAddr+"/", "tokens", len(cfg.Tokens))
	return nil
}
