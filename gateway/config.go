package gateway

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/admin"
	"github.com/fencegate/fencegate/dispatcher"
	"github.com/fencegate/fencegate/executor"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/idempotency"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/fencegate/fencegate/lease"
	"github.com/fencegate/fencegate/outbox"
)

// Config is everything `gateway run` (and `gateway dev`) wires: the
// relay, the adapter runtime with its adapters and the idempotency sweeper,
// the admin server and the metrics server, one component's configuration
// each. Zero fields take the components' defaults; each component's rules
// are its own Config's (Validate), and Validate checks them all, with the
// rules that span components, before anything connects.
type Config struct {
	// Pool is the PostgreSQL pool (the primary). Required by start;
	// not closed by Stop.
	Pool *pgxpool.Pool
	// TransactionPooler says Pool goes through a connection pooler in
	// transaction mode (PgBouncer's pool_mode = transaction): its pgx
	// query mode must need no server-side prepared statements
	// (QueryExecModeExec), and nothing that needs a session across
	// transactions uses it: the relay's LISTEN for new intents and the
	// intake's LISTEN for outcomes use ListenPool, or, without one, the
	// relay polls every Dispatcher.PollInterval and a waiting intake
	// request re-reads its intent every second.
	TransactionPooler bool
	// ListenPool connects to PostgreSQL itself, for the LISTEN
	// connections (the relay's, the intake's outcome waiter's), which a
	// pooler in transaction mode cannot carry. Nil: Pool, unless
	// TransactionPooler. Not closed by Stop.
	ListenPool *pgxpool.Pool
	// Schema is the PostgreSQL schema fencegate's tables live in (gateway
	// migrate --schema), for every part: the relay, the adapters, the
	// sweepers, the admin server. Default: "fencegate". A part's own Schema
	// (Dispatcher.Schema, Idempotency.Schema, …) may be left empty; set, it
	// must be this one.
	Schema string
	// NC is the NATS connection to use. Nil: start dials NATSURL
	// (reconnecting forever) and Stop closes it. A given NC is not closed.
	NC *nats.Conn
	// NATSURL is dialled when NC is nil. Default DefaultNATSURL.
	NATSURL string
	// NATSAuth authenticates the connection Start dials (unused with NC).
	NATSAuth NATSAuth
	// NATSPingInterval is how often the connection Start dials pings its
	// server; two unanswered pings and it reconnects to another seed URL.
	// Default DefaultNATSPingInterval.
	NATSPingInterval time.Duration

	// Dispatcher configures the relay (outbox → JetStream), which runs
	// when it is not nil (&dispatcher.Config{}: its defaults). Registerer
	// and Logger default to the gateway's.
	Dispatcher *dispatcher.Config
	// RunDispatcher runs the relay with Dispatcher's configuration, or
	// with the defaults when Dispatcher is nil.
	//
	// Deprecated: set Dispatcher; &dispatcher.Config{} runs the relay with
	// its defaults.
	RunDispatcher bool

	// Adapters are the adapters of this gateway, one registration each
	// (email.Adapter.Registration, a program's own): their specs join
	// outbox.DefaultKinds at the intake (a registration's spec replaces
	// the default one of its kind), those with an Executor run in the
	// adapter runtime, in this order, and their probes run at start. None
	// with an Executor: no adapter runtime. An adapter keeps the logger and
	// the metrics registerer it was made with: give it Logger and Registry
	// to have its lines and metrics with the gateway's.
	Adapters []adapters.Registration
	// Runtime configures the adapter runtime (Concurrency, MaxAttempts,
	// Unknown, …). Its Executors are those of Adapters, its KeyLockTimeout
	// Idempotency's LockTimeout; Registerer and Logger default to the
	// gateway's.
	Runtime executor.Config
	// Idempotency configures the idempotency store (and its sweeper, which
	// runs whenever the adapter runtime does). Logger defaults to the
	// stack's.
	Idempotency idempotency.Config
	// Retention configures the intent sweeper, which runs with the
	// dispatcher and deletes completed intents past their age. Its
	// KeyRetention is Idempotency's Retention.
	Retention outbox.SweeperConfig

	// MetricsAddr serves Prometheus /metrics and the probes there, without
	// a token. Empty: no server. It must be a loopback address unless
	// MetricsAllowRemote, and there it answers only a loopback Host (but
	// on /healthz), against DNS rebinding.
	MetricsAddr string
	// MetricsAllowRemote lets MetricsAddr be any address, answering any
	// Host: the metrics (queue depths, kinds, build) and the readiness
	// checks' errors are then readable by whoever reaches it.
	MetricsAllowRemote bool
	// AdminAddr serves the admin API and pages there. Empty: no admin
	// server. Without Tokens it must be a loopback address.
	AdminAddr string
	// AdminTLSCert and AdminTLSKey (PEM files) serve the admin API and
	// pages over HTTPS. An AdminAddr that is not loopback needs them, or
	// AdminInsecureHTTP (a TLS-terminating proxy in front).
	AdminTLSCert, AdminTLSKey string
	AdminInsecureHTTP         bool
	// Tokens are the admin API's tokens. None: unauthenticated, loopback
	// only.
	Tokens []admin.Token
	// Namespace is the deployment's namespace on NATS: the one recorded in
	// the database (gateway migrate, derived from the cluster's system
	// identifier and the database's name unless --namespace was given).
	// Empty: the recorded one. Given: it must be the recorded one (a
	// process with another would relay to, or consume from, a stream none
	// of its deployment's processes use), else Start fails naming
	// Namespace. See internal/wire.Namespace.
	Namespace string
	// KeyScope confines the idempotency keys of the intents this gateway
	// enqueues (the admin intake): outbox.KeyScopeResource makes the
	// effective key "<bytes of the resource>:<resource>/<key>". Default: global.
	KeyScope outbox.KeyScope
	// IssuerOptions configure the admin intake's lease.Issuer (e.g.
	// lease.WithLockTimeout from --lock-timeout).
	IssuerOptions []lease.Option
	// EnqueueLockTimeout bounds how long the admin intake's enqueues wait
	// for a resource's control-row lock (outbox.Config.LockTimeout), then
	// 503 busy. Default outbox.DefaultLockTimeout (5s); negative: no
	// bound.
	EnqueueLockTimeout time.Duration
	// Registry receives every component's metrics. Nil: a new registry
	// with the Go and process collectors.
	Registry *prometheus.Registry
	// Logger. Nil: discard.
	Logger *slog.Logger
}

// dispatcherConfig is the relay's configuration, and whether it runs.
func (c *Config) dispatcherConfig() (dispatcher.Config, bool) {
	if c.Dispatcher != nil {
		return *c.Dispatcher, true
	}
	return dispatcher.Config{}, c.RunDispatcher
}

// runsDispatcher reports whether the gateway runs the relay.
func (c *Config) runsDispatcher() bool {
	_, ok := c.dispatcherConfig()
	return ok
}

// runsAdapters reports whether the gateway runs the adapter runtime.
func (c *Config) runsAdapters() bool { return c.executors() > 0 }

// executors counts the adapters that run in this process.
func (c *Config) executors() int {
	n := 0
	for _, r := range c.Adapters {
		if r.Executor != nil {
			n++
		}
	}
	return n
}

// runtimeConfig is the runtime's configuration as the gateway gives it:
// the rule between its ExecuteTimeout and the idempotency store's lock
// timeout is the runtime's, so it is given the store's.
func (c *Config) runtimeConfig() executor.Config {
	rc := c.Runtime
	rc.KeyLockTimeout = c.Idempotency.WithDefaults().LockTimeout
	return rc
}

// sweeperConfig is the intent sweeper's configuration as the gateway gives
// it: keys are kept as long as Idempotency says.
func (c *Config) sweeperConfig() outbox.SweeperConfig {
	sc := c.Retention
	sc.KeyRetention = c.Idempotency.WithDefaults().Retention
	return sc
}

// checkAdapters checks the registrations: each names a kind once, with
// intake rules, and its executor serves that kind.
func (c *Config) checkAdapters() error {
	seen := map[string]bool{}
	for i, r := range c.Adapters {
		field := fmt.Sprintf("Adapters[%d]", i)
		if err := outbox.ValidateKindName(field, r.Kind); err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		switch {
		case seen[r.Kind]:
			return invalid(field, "kind %q is registered twice", r.Kind)
		case r.Spec.DefaultFence != outbox.FenceCommit && r.Spec.DefaultFence != outbox.FenceExecute:
			return invalid(field, "kind %q: Spec.DefaultFence must be commit or execute", r.Kind)
		case r.Executor != nil && r.Executor.Kind() != r.Kind:
			return invalid(field, "kind %q: its executor serves kind %q", r.Kind, r.Executor.Kind())
		}
		seen[r.Kind] = true
	}
	return nil
}

// Validate checks the configuration without connecting to anything: the
// gateway's own fields, each component's Config (its Validate) and the
// rules between them. An error is a *fenceerr.InvalidError whose Field is
// the path of the field in Config ("Runtime.MaxAttempts",
// "Idempotency.LockTimeout", "AdminAddr").
func (c *Config) Validate() error {
	schema := cmp.Or(c.Schema, pgschema.Default)
	if err := pgschema.Check(schema); err != nil {
		return invalid("Schema", "%s", strings.TrimPrefix(err.Error(), "schema: "))
	}
	dcfg, runsDispatcher := c.dispatcherConfig()
	for field, part := range map[string]string{"Dispatcher.Schema": dcfg.Schema, "Idempotency.Schema": c.Idempotency.Schema,
		"Retention.Schema": c.Retention.Schema, "Runtime.Schema": c.Runtime.Schema} {
		if part != "" && part != schema {
			return invalid(field, "%q is not the gateway's Schema %q", part, schema)
		}
	}
	if c.TransactionPooler && c.Pool != nil {
		// A server-side prepared statement outlives its transaction on a
		// server connection the pooler then gives to another client.
		switch m := c.Pool.Config().ConnConfig.DefaultQueryExecMode; m {
		case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeDescribeExec:
			return invalid("TransactionPooler", "Pool's query mode %s does not work through a pooler in transaction mode: use QueryExecModeExec", m)
		}
	}
	if !runsDispatcher && !c.runsAdapters() {
		return invalid("Adapters", "nothing to run: no Dispatcher and no adapter with an Executor")
	}
	if err := c.checkAdapters(); err != nil {
		return err
	}
	if c.NC == nil {
		if err := checkNATSURL(cmp.Or(c.NATSURL, DefaultNATSURL)); err != nil {
			return err
		}
		if _, err := c.NATSAuth.options(); err != nil {
			return err
		}
	}
	if c.NATSPingInterval < 0 {
		return invalid("NATSPingInterval", "must be positive")
	}
	if c.Namespace != "" {
		if _, err := wire.ParseNamespace(c.Namespace); err != nil {
			return invalid("Namespace", "%s", err)
		}
	}
	// The outbox's other fields are the adapters' specs (checkAdapters)
	// and the schema (above).
	if _, err := outbox.ParseKeyScope(string(c.KeyScope)); err != nil {
		return invalid("KeyScope", "%s", err)
	}
	if err := c.checkMetrics(); err != nil {
		return err
	}
	if err := c.checkAdmin(); err != nil {
		return err
	}
	if runsDispatcher {
		if err := within("Dispatcher", dcfg.Validate()); err != nil {
			return err
		}
	}
	if err := within("Idempotency", c.Idempotency.Validate()); err != nil {
		return err
	}
	// The runtime's settings whatever runs: the rule between its
	// ExecuteTimeout and the store's LockTimeout is named after the field
	// the gateway took the lock timeout from.
	if err := within("Runtime", c.runtimeConfig().Validate()); err != nil {
		var inv *fenceerr.InvalidError
		if errors.As(err, &inv) && inv.Field == "Runtime.KeyLockTimeout" {
			return invalid("Idempotency.LockTimeout", "must be more than twice Runtime.ExecuteTimeout (%s), got %s",
				c.Runtime.WithDefaults().ExecuteTimeout, c.Idempotency.WithDefaults().LockTimeout)
		}
		return err
	}
	// Checked whatever this process runs: the sweepers may run in different
	// processes, which must all be given the same retentions.
	if err := outbox.CheckRetention(c.Retention.MaxAge, c.Idempotency.WithDefaults().Retention); err != nil {
		msg := err.Error()
		var inv *fenceerr.InvalidError
		if errors.As(err, &inv) {
			msg = inv.Message
		}
		return invalid("Retention.MaxAge", "must not be shorter than Idempotency.Retention: %s", msg)
	}
	if runsDispatcher {
		if err := within("Retention", c.sweeperConfig().Validate()); err != nil {
			return err
		}
	}
	return nil
}

// checkMetrics checks MetricsAddr: unauthenticated, so loopback unless
// MetricsAllowRemote.
func (c *Config) checkMetrics() error {
	if c.MetricsAddr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
		return invalid("MetricsAddr", "must be host:port, e.g. 127.0.0.1:9090: %s", errmap.OneLine(err.Error()))
	}
	if !c.MetricsAllowRemote && !admin.IsLoopbackAddr(c.MetricsAddr) {
		return invalid("MetricsAddr", "%q is not a loopback address: /metrics and the probes need no token; "+
			"bind 127.0.0.1 or, to let other hosts scrape it, give MetricsAllowRemote", c.MetricsAddr)
	}
	return nil
}

// checkAdmin checks the admin server's fields.
func (c *Config) checkAdmin() error {
	// Tokens given are checked whether or not the admin server runs, like
	// every value given.
	if err := admin.CheckTokens(c.Tokens); err != nil {
		return invalid("Tokens", "%s", strings.TrimPrefix(errmap.OneLine(err.Error()), "admin: "))
	}
	if c.AdminAddr == "" {
		return nil
	}
	if (c.AdminTLSCert == "") != (c.AdminTLSKey == "") {
		return invalid("AdminTLSCert", "and AdminTLSKey go together")
	}
	if c.AdminTLSCert != "" {
		// Loaded now, before anything connects; admin.New loads it again.
		if _, err := tls.LoadX509KeyPair(c.AdminTLSCert, c.AdminTLSKey); err != nil {
			return invalid("AdminTLSCert", "and AdminTLSKey: %s", errmap.OneLine(err.Error()))
		}
	}
	if err := admin.CheckTransport(c.AdminAddr, c.AdminTLSCert != "", c.AdminInsecureHTTP); err != nil {
		return invalid("AdminAddr", "%q is not a loopback address: serve it over TLS (AdminTLSCert, AdminTLSKey) or, behind a TLS-terminating proxy, give AdminInsecureHTTP", c.AdminAddr)
	}
	if err := admin.CheckListenAddr(c.AdminAddr, c.Tokens); err != nil {
		if errors.Is(err, admin.ErrNoTokensNonLoopback) {
			return invalid("AdminAddr", "%q is not a loopback address and no admin tokens are configured "+
				"(Tokens): bind 127.0.0.1 or configure tokens", c.AdminAddr)
		}
		return invalid("AdminAddr", "must be host:port, e.g. 127.0.0.1:8080: %s", errmap.OneLine(err.Error()))
	}
	return nil
}

// invalid is a bad Config field: a *fenceerr.InvalidError naming its path.
func invalid(field, format string, args ...any) error {
	return fmt.Errorf("gateway: %w", fenceerr.Invalid(field, format, args...))
}

// within puts a component's invalid-input error under the component's
// field of Config: the Dispatcher's "BatchSize" is "Dispatcher.BatchSize".
// Other errors pass as they are.
func within(part string, err error) error {
	if !errors.Is(err, fenceerr.ErrInvalid) {
		return err
	}
	return fmt.Errorf("gateway: %w", fenceerr.Within(part, err))
}
