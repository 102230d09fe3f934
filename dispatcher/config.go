package dispatcher

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config's fields.
const (
	DefaultBatchSize       = 1024
	DefaultMaxInFlight     = 4096
	DefaultClaimTTL        = 30 * time.Second
	DefaultRelayTimeout    = 30 * time.Second
	DefaultPollInterval    = time.Second
	DefaultPublishTimeout  = 10 * time.Second
	DefaultStreamReplicas  = 1
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultStreamMaxAge    = time.Hour
	DefaultBacklogInterval = 5 * time.Second
	DefaultDBTimeout       = 10 * time.Second
)

// Config configures a Dispatcher. The zero value of every field means its
// default.
type Config struct {
	// Schema is the PostgreSQL schema fencegate's tables live in (gateway
	// migrate --schema). Default: "fencegate".
	Schema string
	// Namespace is the deployment's namespace on NATS (see
	// gateway.Config.Namespace): the stream GATEWAY_INTENTS_<ns>, subjects
	// gateway.<ns>.intents.<kind>, message ids and the Fencegate-Namespace
	// header. Empty: the names from before namespaces (one deployment per
	// NATS only). The gateway always sets its database's.
	Namespace string
	// ID names this dispatcher in logs, metrics and written claims. It must be unique among
	// running dispatchers: Stop releases every claim held under it.
	// Default: "<hostname>-<pid>-<random>".
	ID string
	// BatchSize is the most intents one claim takes. Default: 1024 (measured 15–20% more relay throughput than 256).
	BatchSize int
	// MaxInFlight bounds the published messages awaiting their PubAck, over
	// all batches. At least BatchSize. Default: 4096.
	MaxInFlight int
	// ClaimTTL is how long a claim may stay silent: the idle timeout of the
	// transaction that holds it, after which the server ends the session of
	// a dispatcher that hangs holding claims (a dead one loses them at
	// once). A claim lost that way while its holder still publishes lets a
	// second dispatcher publish the same message id, absorbed by the
	// duplicate window. Longer than PublishTimeout. Default: 30s.
	ClaimTTL time.Duration
	// RelayTimeout is how long an intent may stay `relayed` without an
	// outcome before it is published again. Default: 30s.
	RelayTimeout time.Duration
	// PollInterval is the fallback wake-up when no notification arrives.
	// Default: 1s.
	PollInterval time.Duration
	// PublishTimeout is how long a message waits for its PubAck before it
	// counts as a publish error. Default: 10s.
	PublishTimeout time.Duration
	// DisableListen turns off LISTEN fencegate_intents; the dispatcher then
	// only polls (every PollInterval).
	DisableListen bool
	// ListenPool is where the LISTEN connection comes from: a pool on
	// PostgreSQL itself when the dispatcher's pool goes through a
	// connection pooler in transaction mode (PgBouncer), where a LISTEN
	// outlives its transaction on a server connection other clients then
	// use, and never hears anything. Nil: the dispatcher's pool. Not
	// closed by the dispatcher.
	ListenPool *pgxpool.Pool
	// StreamReplicas is the stream's replica count. Default: 1 (production
	// clusters use 3).
	StreamReplicas int
	// DuplicateWindow is the stream's duplicate-detection window. Longer
	// than ClaimTTL (a shorter one is refused), so a message published
	// again after an expired claim is still recognised. Default: 2m.
	DuplicateWindow time.Duration
	// StreamMaxAge is how long the stream keeps a message (its MaxAge).
	// The stream is transport, not a record: an outcome is in PostgreSQL,
	// and an intent whose message the stream dropped before it was
	// settled is relayed again after RelayTimeout. Without a bound the
	// stream kept every message ever relayed. At least DuplicateWindow (a
	// shorter one is refused). Default: 1h, or DuplicateWindow if longer.
	StreamMaxAge time.Duration
	// BacklogInterval is how often the pending-backlog gauge is refreshed.
	// Default: 5s.
	BacklogInterval time.Duration
	// DBTimeout bounds each database statement. Default: 10s.
	DBTimeout time.Duration
	// NewBackoff returns the backoff policy applied after publish or database
	// errors. Default: exponential from 100ms to 30s, ±50% jitter, never
	// giving up.
	NewBackoff func() backoff.BackOff
	// Registerer registers the dispatcher's metrics. Nil: not registered.
	Registerer prometheus.Registerer
	// Logger. Nil: discard.
	Logger *slog.Logger
	// Now is the clock used for latency metrics. Default: time.Now.
	Now func() time.Time
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.ID = cmp.Or(c.ID, defaultID())
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, max(DefaultMaxInFlight, c.BatchSize))
	c.ClaimTTL = cmp.Or(c.ClaimTTL, DefaultClaimTTL)
	c.RelayTimeout = cmp.Or(c.RelayTimeout, DefaultRelayTimeout)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.StreamReplicas = cmp.Or(c.StreamReplicas, DefaultStreamReplicas)
	c.DuplicateWindow = cmp.Or(c.DuplicateWindow, DefaultDuplicateWindow)
	c.StreamMaxAge = cmp.Or(c.StreamMaxAge, max(DefaultStreamMaxAge, c.DuplicateWindow))
	c.BacklogInterval = cmp.Or(c.BacklogInterval, DefaultBacklogInterval)
	c.DBTimeout = cmp.Or(c.DBTimeout, DefaultDBTimeout)
	if c.NewBackoff == nil {
		c.NewBackoff = DefaultBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// DefaultBackoff is Config.NewBackoff's default: exponential from 100ms to
// 30s with ±50% jitter, never giving up.
func DefaultBackoff() backoff.BackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(30*time.Second),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMaxElapsedTime(0),
	)
}

// Validate checks c, its defaults applied, connecting to nothing. An error
// is a *fenceerr.InvalidError naming the field (BatchSize, ClaimTTL, …).
func (c Config) Validate() error { return c.WithDefaults().validate() }

func (c Config) validate() error {
	if _, err := pgschema.Parse(c.Schema); err != nil {
		return invalidConfig("Schema", "%s", strings.TrimPrefix(err.Error(), "schema: "))
	}
	if c.Namespace != "" {
		if _, err := wire.ParseNamespace(c.Namespace); err != nil {
			return invalidConfig("Namespace", "%s", err)
		}
	}
	switch {
	case c.BatchSize < 1:
		return invalidConfig("BatchSize", "must be at least 1, got %d", c.BatchSize)
	case c.MaxInFlight < c.BatchSize:
		return invalidConfig("MaxInFlight", "(%d) must be at least BatchSize (%d)", c.MaxInFlight, c.BatchSize)
	case c.PublishTimeout <= 0:
		return invalidConfig("PublishTimeout", "must be positive")
	case c.ClaimTTL <= c.PublishTimeout:
		return invalidConfig("ClaimTTL", "(%s) must be longer than PublishTimeout (%s)", c.ClaimTTL, c.PublishTimeout)
	case c.RelayTimeout <= 0:
		return invalidConfig("RelayTimeout", "must be positive")
	case c.PollInterval <= 0:
		return invalidConfig("PollInterval", "must be positive")
	case c.BacklogInterval <= 0:
		return invalidConfig("BacklogInterval", "must be positive")
	case c.DBTimeout <= 0:
		return invalidConfig("DBTimeout", "must be positive")
	case c.StreamReplicas < 1 || c.StreamReplicas > 5:
		return invalidConfig("StreamReplicas", "must be 1 to 5, got %d", c.StreamReplicas)
	case c.DuplicateWindow < time.Second:
		return invalidConfig("DuplicateWindow", "must be at least 1s, got %s", c.DuplicateWindow)
	case c.DuplicateWindow <= c.ClaimTTL:
		// A message published again after an expired claim (the hung
		// holder still publishing, another dispatcher relaying the same
		// intent) must still be recognised as the duplicate it is.
		return invalidConfig("DuplicateWindow", "(%s) must be longer than ClaimTTL (%s), so that a message published again after an expired claim is recognised as a duplicate", c.DuplicateWindow, c.ClaimTTL)
	case c.StreamMaxAge < c.DuplicateWindow:
		// JetStream refuses a duplicate window longer than the max age.
		return invalidConfig("StreamMaxAge", "(%s) must be at least DuplicateWindow (%s)", c.StreamMaxAge, c.DuplicateWindow)
	case len(c.ID) > 200:
		return invalidConfig("ID", "is longer than 200 bytes")
	}
	return nil
}

// invalidConfig is a bad Config field: a *fenceerr.InvalidError naming it.
func invalidConfig(field, format string, args ...any) error {
	return fmt.Errorf("dispatcher: %w", fenceerr.Invalid(field, format, args...))
}

func defaultID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", cmp.Or(host, "dispatcher"), os.Getpid(), hex.EncodeToString(b))
}
