package admin

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fencegate/fencegate/docs"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/httpserver"
	"github.com/fencegate/fencegate/internal/startstop"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/operator"
	"github.com/fencegate/fencegate/outbox"
)

// DefaultMaxBodyBytes is Config.MaxBodyBytes's default (1 MiB).
const DefaultMaxBodyBytes = 1 << 20

// ErrNoTokensNonLoopback is returned when a server without tokens is asked
// to bind an address that is not loopback.
var ErrNoTokensNonLoopback = errors.New("admin: no API tokens configured: refusing to bind a non-loopback address")

// Config configures a Server.
type Config struct {
	// Pool is the PostgreSQL pool (the primary). Required.
	Pool *pgxpool.Pool
	// Outbox enqueues intents for the intake. Required.
	Outbox *outbox.Client
	// Issuer grants leases and advances epochs for the intake. Required.
	Issuer *lease.Issuer
	// Store is the idempotency key store. Optional: the actions change keys
	// in their own transaction; the Store is kept for pages that show keys.
	Store *idempotency.Store
	// Tokens are the accepted bearer tokens. None: every request is
	// anonymous and allowed, and the server binds loopback addresses only.
	Tokens []Token
	// MaxBodyBytes limits a request body. Default: DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Registry serves /metrics and receives the API's own metrics.
	// Default: a new registry.
	Registry *prometheus.Registry
	// NATSReady reports whether NATS is reachable, for /readyz. Nil: NATS
	// is not checked (reported as "not_configured").
	NATSReady func() error
	// ReadyTimeout bounds each /readyz check. Default: 2 seconds.
	ReadyTimeout time.Duration
	// TLSCertFile and TLSKeyFile (PEM) serve HTTPS (HTTP/2 too); the
	// session cookie is then Secure. Both or neither.
	TLSCertFile, TLSKeyFile string
	// InsecureHTTP allows plain HTTP on an address that is not loopback
	// (behind a TLS-terminating proxy). Without it, such an address needs
	// TLS.
	InsecureHTTP bool
	// AuthFailureLimit is how many failed authentications one client
	// address may make within AuthFailureWindow before every request of
	// it that needs a token is answered 429 until the window ends
	// (limit.go). Default: DefaultAuthFailureLimit (10).
	AuthFailureLimit int
	// AuthFailureWindow is the window of AuthFailureLimit, from an
	// address's first failure. Default: DefaultAuthFailureWindow (1 minute).
	AuthFailureWindow time.Duration
	// Ready, when set, answers /readyz instead of the server's own check
	// (PostgreSQL and NATSReady): the gateway hands it its readiness of
	// every part it runs, so that the admin address and the metrics
	// address say the same.
	Ready http.Handler
	// Logger. Nil: discard.
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, DefaultMaxBodyBytes)
	c.ReadyTimeout = cmp.Or(c.ReadyTimeout, 2*time.Second)
	c.AuthFailureLimit = cmp.Or(c.AuthFailureLimit, DefaultAuthFailureLimit)
	c.AuthFailureWindow = cmp.Or(c.AuthFailureWindow, DefaultAuthFailureWindow)
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Pool == nil:
		return fenceerr.Invalid("Pool", "is required")
	case c.Outbox == nil:
		return fenceerr.Invalid("Outbox", "is required")
	case c.Issuer == nil:
		return fenceerr.Invalid("Issuer", "is required")
	case c.MaxBodyBytes < 64:
		return fenceerr.Invalid("MaxBodyBytes", "must be at least 64, got %d", c.MaxBodyBytes)
	case c.AuthFailureLimit < 1:
		return fenceerr.Invalid("AuthFailureLimit", "must be at least 1, got %d", c.AuthFailureLimit)
	case c.AuthFailureWindow <= 0:
		return fenceerr.Invalid("AuthFailureWindow", "must be positive, got %s", c.AuthFailureWindow)
	case (c.TLSCertFile == "") != (c.TLSKeyFile == ""):
		return fenceerr.Invalid("TLSCertFile", "and TLSKeyFile go together")
	}
	if err := CheckTokens(c.Tokens); err != nil {
		return fenceerr.Invalid("Tokens", "%s", strings.TrimPrefix(err.Error(), "admin: "))
	}
	return nil
}

// Server is the admin HTTP API. It is safe for concurrent use.
type Server struct {
	cfg     Config
	op      *operator.Operator
	auth    *authenticator
	mux     *routeMux
	metrics *apiMetrics

	// The HTML pages (pages.go): templates, the inlined style sheet and
	// its CSP hash, and the cross-origin check of their forms.
	tmpl      map[string]*template.Template
	style     template.CSS
	styleHash string
	cop       *http.CrossOriginProtection
	// sessions are the pages' signed-in browsers (pages_auth.go).
	sessions *sessionStore
	// limiter counts failed authentications per client address (limit.go).
	limiter *failureLimiter
	// pagePatterns are the routes of the pages, which answer a foreign
	// Host with an HTML page of their own.
	pagePatterns map[string]bool
	// tls is nil for plain HTTP.
	tls *tls.Config
	// openapi is the API's description as JSON (docs/openapi.yaml).
	openapi []byte

	// life is the lifecycle of Start/Stop; serveErr is why serving ended.
	life     startstop.Lifecycle
	mu       sync.Mutex
	serveErr error
}

// New returns a Server. With no tokens it logs that the API is
// unauthenticated and may only bind loopback addresses.
func New(cfg Config) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newAPIMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	op, err := operator.New(cfg.Pool, cfg.Outbox.Schema())
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, op: op, auth: newAuthenticator(cfg.Tokens), mux: &routeMux{ServeMux: http.NewServeMux()}, metrics: m, sessions: newSessionStore(),
		limiter: newFailureLimiter(cfg.AuthFailureLimit, cfg.AuthFailureWindow)}
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, &TLSError{Err: err}
		}
		s.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if len(cfg.Tokens) == 0 {
		cfg.Logger.Warn("admin: no API tokens configured: requests are not authenticated; binding loopback addresses only")
	}
	if s.openapi, err = docs.OpenAPIJSON(); err != nil {
		return nil, fmt.Errorf("admin: the OpenAPI description: %w", err)
	}
	s.mux.group = routeAPI
	s.routes()
	s.mux.group = routePage
	if err := s.pageRoutes(); err != nil {
		return nil, err
	}
	return s, nil
}

// Who registered a route: the API (routes, described by
// docs/openapi.yaml) or the HTML pages (pageRoutes).
const (
	routeAPI  = "api"
	routePage = "page"
)

// route is a pattern registered on the server's mux, and by whom.
type route struct {
	pattern string
	group   string
}

// routeMux is the server's mux; it records every pattern registered, so
// that the routes can be listed and held against the OpenAPI description
// (an http.ServeMux cannot list its own).
type routeMux struct {
	*http.ServeMux
	group  string
	routes []route
}

// Handle registers h for pattern and records it under the current group.
func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.ServeMux.Handle(pattern, h)
	m.routes = append(m.routes, route{pattern: pattern, group: m.group})
}

// HandleFunc is Handle for a function.
func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// Handler returns the HTTP handler of every route.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// Listen opens a TCP listener on addr, refusing (ErrNoTokensNonLoopback) a
// non-loopback address when no tokens are configured. Host names are
// checked after binding, on the address actually bound.
func (s *Server) Listen(addr string) (net.Listener, error) {
	if len(s.cfg.Tokens) == 0 {
		if err := checkLoopback(addr); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen on %s: %w", addr, err)
	}
	if len(s.cfg.Tokens) == 0 {
		if err := checkLoopback(ln.Addr().String()); err != nil {
			_ = ln.Close()
			return nil, err
		}
		s.cfg.Logger.Warn("admin: serving without authentication on loopback", "addr", ln.Addr().String())
	}
	return ln, nil
}

// CheckListenAddr reports whether a server with these tokens may listen on
// addr, without binding it: with no tokens only loopback addresses
// ("localhost" and loopback IPs) are allowed (an error wrapping
// ErrNoTokensNonLoopback otherwise). Listen checks again on the address
// actually bound.
func CheckListenAddr(addr string, tokens []Token) error {
	if len(tokens) > 0 {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("admin: bad listen address %q: %w", addr, err)
		}
		return nil
	}
	return checkLoopback(addr)
}

// ErrPlainHTTPNonLoopback is matched by CheckTransport's error: tokens and
// sessions would cross the network in clear text.
var ErrPlainHTTPNonLoopback = errors.New("admin: plain HTTP on an address that is not loopback")

// CheckTransport refuses plain HTTP on an address that is not loopback
// unless insecure says so explicitly (a TLS-terminating proxy in front).
func CheckTransport(addr string, useTLS, insecure bool) error {
	if useTLS || insecure || checkLoopback(addr) == nil {
		return nil
	}
	return fmt.Errorf("%w (%q): give a certificate (TLS) or, behind a TLS-terminating proxy, allow it explicitly", ErrPlainHTTPNonLoopback, addr)
}

// TLSError: the certificate or key could not be loaded.
type TLSError struct{ Err error }

func (e *TLSError) Error() string { return "admin: load the TLS certificate: " + e.Err.Error() }
func (e *TLSError) Unwrap() error { return e.Err }

// checkLoopback accepts "localhost" and loopback IPs; an empty host (all
// interfaces) is not loopback.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("admin: bad listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.Unmap().IsLoopback() {
		return fmt.Errorf("%w (%q); configure tokens or bind 127.0.0.1", ErrNoTokensNonLoopback, addr)
	}
	return nil
}

// Serve listens on addr (see Listen) and serves until ctx is done, then
// shuts down gracefully, waiting up to 10 s for requests in flight.
func (s *Server) Serve(ctx context.Context, addr string) error {
	ln, err := s.Listen(addr)
	if err != nil {
		return err
	}
	return s.ServeListener(ctx, ln)
}

// ListenAndServe is Serve with a background context: it serves until the
// listener fails.
func (s *Server) ListenAndServe(addr string) error {
	return s.Serve(context.Background(), addr)
}

// ServeListener serves on ln until ctx is done. ln is not checked: use
// Listen to get the loopback rule.
func (s *Server) ServeListener(ctx context.Context, ln net.Listener) error {
	srv := httpserver.New(s.Handler(), s.cfg.Logger)
	done := make(chan error, 1)
	if s.tls != nil {
		srv.TLSConfig = s.tls.Clone()
		go func() { done <- srv.ServeTLS(ln, "", "") }() // HTTP/2 too
	} else {
		go func() { done <- srv.Serve(ln) }()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	<-done
	return err
}

// Start serves on ln in the background until Stop, or until ctx is done,
// and returns once the server is running: ln is bound already, so
// connections queue on it from the start. ln is not checked: use Listen to
// get the loopback rule. A second Start — or a Start after Stop — is an
// error (matching startstop.ErrStarted), and ln is then left to the
// caller; otherwise the server closes it when it stops.
func (s *Server) Start(ctx context.Context, ln net.Listener) error {
	ctx, err := s.life.Start(ctx, "admin: server")
	if err != nil {
		return err
	}
	go func() {
		defer s.life.Done()
		err := s.ServeListener(ctx, ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		// Recorded before Done: Err is set once Stopped is closed.
		s.mu.Lock()
		s.serveErr = err
		s.mu.Unlock()
	}()
	return nil
}

// Stop shuts the server down gracefully — it stops accepting and waits up
// to 10 s for the requests in flight — and returns once it has stopped.
// Idempotent.
func (s *Server) Stop() { s.life.Stop() }

// Stopped is closed once the server started by Start has stopped: after
// Stop, once Start's context is done, or when serving failed (Err).
func (s *Server) Stopped() <-chan struct{} { return s.life.Stopped() }

// Err returns why the server started by Start stopped: the listener's
// failure, or a graceful shutdown that ran out of time. It is nil while
// the server runs and after a clean stop.
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serveErr
}

// apiMetrics are the API's own metrics.
type apiMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newAPIMetrics(reg *prometheus.Registry) (*apiMetrics, error) {
	m := &apiMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fencegate_admin_requests_total",
			Help: "Admin API requests by route and HTTP status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fencegate_admin_request_duration_seconds",
			Help:    "Admin API request duration by route.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("admin: register metrics: %w", err)
		}
	}
	return m, nil
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// serveHTTP routes through the mux, turning its plain-text 404 and 405 into
// JSON errors, and counts every request.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	_, pattern := s.mux.Handler(r)
	route := pattern
	if len(s.cfg.Tokens) == 0 && !loopbackHost(r.Host) && !openPath(r) && !s.pagePatterns[pattern] {
		// Without tokens the server is reachable only on loopback, but a
		// browser page elsewhere could still reach it through DNS
		// rebinding (a name that resolves to 127.0.0.1): such requests
		// carry that name in Host. Refuse every non-loopback Host, on
		// every path but /healthz (the pages answer with a page of their
		// own).
		writeMisdirected(sw, "without API tokens this server")
		s.metrics.requests.WithLabelValues("misdirected", strconv.Itoa(sw.code)).Inc()
		return
	}
	if pattern == "" || (strings.HasPrefix(r.URL.Path, "/api/") && !canonicalPath(r.URL.EscapedPath())) {
		// An API path with dot segments or a double slash is no endpoint
		// of ours: the mux would answer it with a redirect to its
		// canonical form, in HTML, before any token check. The escaped
		// path, as the mux reads it: a resource named ".." or "a//b",
		// percent-encoded, is one segment.
		route = "unmatched"
		s.serveUnmatched(sw, r)
	} else {
		s.mux.ServeHTTP(sw, r)
	}
	s.metrics.requests.WithLabelValues(route, strconv.Itoa(sw.code)).Inc()
	s.metrics.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
}

// openPath reports whether r asks for /healthz, which answers any Host:
// it says only "ok", and a probe may reach the process by any name.
func openPath(r *http.Request) bool { return r.URL.Path == "/healthz" }

// writeMisdirected answers 421 to a request whose Host is not a loopback
// name; who names the server that refuses it.
func writeMisdirected(w http.ResponseWriter, who string) {
	writeError(w, &apiError{Code: errmap.Misdirected,
		Message: who + " answers only to a loopback Host (localhost, 127.0.0.1, [::1])"})
}

// LoopbackHostOnly wraps h, a handler served on a loopback address without
// authentication (the gateway's metrics server), so that it answers only
// requests whose Host is a loopback name: a web page elsewhere cannot read
// it through DNS rebinding (a name of its own resolving to 127.0.0.1).
// Other Hosts get 421 misdirected, except on /healthz.
func LoopbackHostOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) && !openPath(r) {
			writeMisdirected(w, "this unauthenticated server")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// IsLoopbackAddr reports whether addr (host:port) is a loopback address:
// "localhost" or a loopback IP. An empty host (every interface) is not.
func IsLoopbackAddr(addr string) bool { return checkLoopback(addr) == nil }

// serveUnmatched answers a request no route matched: 405 (with Allow) when
// the path exists for other methods, 404 otherwise.
func (s *Server) serveUnmatched(w http.ResponseWriter, r *http.Request) {
	if !canonicalPath(r.URL.EscapedPath()) {
		writeError(w, errmap.New(errmap.NotFound, "no such endpoint: "+r.URL.Path+" (not a canonical path: no dot segments or double slashes)"))
		return
	}
	rec := &headerRecorder{header: http.Header{}}
	h, _ := s.mux.Handler(r)
	h.ServeHTTP(rec, r)
	if rec.code == http.StatusMethodNotAllowed {
		if allow := rec.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		writeError(w, errmap.New(errmap.MethodNotAllowed, fmt.Sprintf("%s is not allowed on %s", r.Method, r.URL.Path)))
		return
	}
	writeError(w, errmap.New(errmap.NotFound, "no such endpoint: "+r.URL.Path))
}

// canonicalPath reports whether p is in the form the mux matches without
// a redirect: no "." or ".." segment, no empty one ("//").
func canonicalPath(p string) bool {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// headerRecorder captures the mux's own 404/405 answer.
type headerRecorder struct {
	header http.Header
	code   int
}

func (h *headerRecorder) Header() http.Header         { return h.header }
func (h *headerRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (h *headerRecorder) WriteHeader(code int)        { h.code = code }

func (s *Server) routes() {
	// Health and readiness are for load balancers and orchestrators:
	// no token.
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	// The description holds no secret; a client reads it before it has a
	// token. A server without tokens still answers it only on loopback.
	s.mux.HandleFunc("GET /api/v1/openapi.json", s.serveOpenAPI)
	s.mux.Handle("GET /metrics", s.require(RoleOperator,
		promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn)})))

	// Operator: reads and actions.
	s.mux.Handle("GET /api/v1/intents", s.api(RoleOperator, s.listIntents))
	s.mux.Handle("GET /api/v1/intents/{id}", s.api(RoleOperator, s.getIntent))
	s.mux.Handle("GET /api/v1/resources/{id}", s.api(RoleOperator, s.getResource))
	s.mux.Handle("GET /api/v1/resources/{id}/epochs", s.api(RoleOperator, s.getEpochs))
	s.mux.Handle("POST /api/v1/intents/bulk", s.api(RoleOperator, s.bulk))
	s.mux.Handle("POST /api/v1/intents/{id}/retry", s.api(RoleOperator, s.action(operator.ActionRetry)))
	s.mux.Handle("POST /api/v1/intents/{id}/cancel", s.api(RoleOperator, s.action(operator.ActionCancel)))
	s.mux.Handle("POST /api/v1/intents/{id}/resolve", s.api(RoleOperator, s.action(operator.ActionResolve)))

	// Worker intake, continuing the caller's trace.
	s.mux.Handle("POST /api/v1/leases", s.intake(s.acquireLease))
	s.mux.Handle("POST /api/v1/leases/renew", s.intake(s.renewLease))
	s.mux.Handle("POST /api/v1/leases/release", s.intake(s.releaseLease))
	s.mux.Handle("POST /api/v1/epochs", s.intake(s.advanceEpoch))
	s.mux.Handle("POST /api/v1/intents", s.intake(s.enqueue))
}

// serveOpenAPI answers the API's OpenAPI 3.1 description, as JSON.
func (s *Server) serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(s.openapi)))
	_, _ = w.Write(s.openapi)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz checks PostgreSQL and NATS, each with its own timeout, and names
// the one that failed.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Ready != nil {
		s.cfg.Ready.ServeHTTP(w, r)
		return
	}
	checks := map[string]string{}
	ok := true
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReadyTimeout)
	err := s.cfg.Pool.Ping(ctx)
	cancel()
	if err != nil {
		ok = false
		checks["postgres"] = "unavailable: " + oneLine(err.Error())
	} else {
		checks["postgres"] = "ok"
	}
	switch {
	case s.cfg.NATSReady == nil:
		checks["nats"] = "not_configured"
	default:
		if err := s.natsReady(r.Context()); err != nil {
			ok = false
			checks["nats"] = "unavailable: " + oneLine(err.Error())
		} else {
			checks["nats"] = "ok"
		}
	}
	code, status := http.StatusOK, "ready"
	if !ok {
		code, status = http.StatusServiceUnavailable, "unavailable"
	}
	writeJSON(w, code, map[string]any{"status": status, "checks": checks})
}

// natsReady runs NATSReady bounded by ReadyTimeout; a check that hangs
// counts as failed.
func (s *Server) natsReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.cfg.NATSReady() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer within %s", s.cfg.ReadyTimeout)
	}
}
