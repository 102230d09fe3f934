package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/internal/intents"
	"github.com/fencegate/fencegate/internal/pgschema"
	"github.com/fencegate/fencegate/internal/startstop"
)

// Defaults of SweeperConfig's fields.
const (
	// DefaultSweepMaxAge is as long as DefaultKeyRetention: operation-id
	// dedup lasts as long as business-key dedup (see CheckRetention).
	DefaultSweepMaxAge   = 30 * 24 * time.Hour
	DefaultSweepBatch    = 1000
	DefaultSweepInterval = time.Minute
	// DefaultKeyRetention is the idempotency store's default key retention
	// (idempotency.DefaultRetention, which this package cannot import: the
	// idempotency package imports it; a test keeps the two equal).
	DefaultKeyRetention = 30 * 24 * time.Hour
)

// CheckRetention checks that intents are kept (intentRetention, the
// sweeper's MaxAge) at least as long as completed idempotency keys
// (keyRetention, idempotency.Config.Retention); zero means the default.
//
// An intent's row is what dedups its operation id: once swept, a late
// replay of the operation id is enqueued as a new intent. While the intent's
// business key is still kept, that new intent would not execute but be
// answered from the key with the old outcome — a status nobody asked for
// and nothing explains. With intents kept at least as long as keys, a
// replay either finds its intent (duplicate) or, past both horizons, is a
// new operation. The error is a *ValidationError naming intent_retention.
func CheckRetention(intentRetention, keyRetention time.Duration) error {
	intentRetention = cmp.Or(intentRetention, DefaultSweepMaxAge)
	keyRetention = cmp.Or(keyRetention, DefaultKeyRetention)
	if intentRetention < keyRetention {
		return &ValidationError{Field: "intent_retention", Message: fmt.Sprintf(
			"intent retention %s is shorter than the key retention %s: operation-id dedup would end while "+
				"business-key dedup goes on, and a late replay would be answered from the key as a new intent; "+
				"keep intents at least as long as keys", intentRetention, keyRetention)}
	}
	return nil
}

// SweeperConfig configures a Sweeper.
type SweeperConfig struct {
	// Schema is the PostgreSQL schema of fencegate's tables. Default:
	// "fencegate".
	Schema string
	// MaxAge is how long a completed intent is kept, from its completion,
	// and so how long its operation id dedups. It must not be shorter than
	// KeyRetention (CheckRetention). Default: 30 days.
	MaxAge time.Duration
	// KeyRetention is how long the deployment keeps completed idempotency
	// keys (idempotency.Config.Retention); only checked against MaxAge.
	// Default: DefaultKeyRetention (30 days).
	KeyRetention time.Duration
	// Batch is how many intents one delete statement removes at most, so
	// no statement holds many row locks or runs for long. Default: 1000.
	Batch int
	// Interval is how often the sweeper runs. Default: 1 minute.
	Interval time.Duration
	// Logger. Nil: discard.
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SweeperConfig) WithDefaults() SweeperConfig {
	c.MaxAge = cmp.Or(c.MaxAge, DefaultSweepMaxAge)
	c.KeyRetention = cmp.Or(c.KeyRetention, DefaultKeyRetention)
	c.Batch = cmp.Or(c.Batch, DefaultSweepBatch)
	c.Interval = cmp.Or(c.Interval, DefaultSweepInterval)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks c, its defaults applied, connecting to nothing. An error
// is a *ValidationError naming the field (MaxAge, Batch, …; a MaxAge
// shorter than KeyRetention names MaxAge, see CheckRetention).
func (c SweeperConfig) Validate() error { return c.WithDefaults().validate() }

func (c SweeperConfig) validate() error {
	switch {
	case c.MaxAge < time.Second:
		return invalidSweeper("MaxAge", "must be at least 1s, got %s", c.MaxAge)
	case c.Batch < 1 || c.Batch > 100_000:
		return invalidSweeper("Batch", "must be between 1 and 100000, got %d", c.Batch)
	case c.Interval < time.Millisecond:
		return invalidSweeper("Interval", "must be at least 1ms, got %s", c.Interval)
	}
	if _, err := pgschema.Parse(c.Schema); err != nil {
		return invalidSweeper("Schema", "%s", strings.TrimPrefix(err.Error(), "schema: "))
	}
	if err := CheckRetention(c.MaxAge, c.KeyRetention); err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			return invalidSweeper("MaxAge", "%s", ve.Message)
		}
		return err
	}
	return nil
}

// invalidSweeper is a bad SweeperConfig field: a *ValidationError naming it.
func invalidSweeper(field, format string, args ...any) error {
	return fmt.Errorf("outbox: sweeper: %w", fenceerr.Invalid(field, format, args...))
}

// sweepTimeout bounds one sweep run.
const sweepTimeout = time.Minute

// Sweeper deletes completed intents older than MaxAge, in the background:
// every Interval (first right after Start) it deletes batches of at most
// Batch intents, each its own short transaction, until none is left.
//
// Only succeeded, failed, superseded and cancelled intents are deleted, by
// their completed_at. Pending and relayed intents are work in progress;
// unknown ones wait for an operator to resolve them and are never deleted
// automatically (like the idempotency store's held keys). The business
// idempotency keys are kept by their own store and retention: deleting an
// intent does not make its effect repeatable. Intents are kept at least as
// long as keys (CheckRetention), so an operation id dedups as long as its
// business key does.
type Sweeper struct {
	pool *pgxpool.Pool
	cfg  SweeperConfig

	// life is the sweeper's Start/Stop (internal/startstop).
	life startstop.Lifecycle
}

// NewSweeper returns a Sweeper of the outbox behind pool, not started. A
// nil pool, or a bad cfg field, is a *fenceerr.InvalidError naming it.
func NewSweeper(pool *pgxpool.Pool, cfg SweeperConfig) (*Sweeper, error) {
	if pool == nil {
		return nil, invalidSweeper("pool", "must not be nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Sweeper{pool: pool, cfg: cfg}, nil
}

// SweepOnce deletes one batch and returns how many intents it deleted.
func (s *Sweeper) SweepOnce(ctx context.Context) (int, error) {
	// The statement, and why it skips locked rows: internal/intents.Sweep.
	n, err := intents.In(pgschema.MustParse(s.cfg.Schema)).Sweep(ctx, s.pool, s.cfg.MaxAge, s.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("outbox: sweep: %w", err)
	}
	return int(n), nil
}

// Sweep deletes batches until a batch comes back short or ctx ends, and
// returns how many intents it deleted.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := s.SweepOnce(ctx)
		total += n
		if err != nil {
			return total, err
		}
		if n < s.cfg.Batch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("outbox: sweep: %w", err)
		}
	}
}

// Start starts sweeping in the background and returns once it runs. The
// sweeper stops when ctx ends or Stop is called. A Sweeper starts once.
func (s *Sweeper) Start(ctx context.Context) error {
	ctx, err := s.life.Start(ctx, "outbox: sweeper")
	if err != nil {
		return err
	}
	go s.loop(ctx)
	return nil
}

// Stop stops the sweeper and waits for its current batch to end.
func (s *Sweeper) Stop() { s.life.Stop() }

// Stopped is closed once the sweeper has stopped.
func (s *Sweeper) Stopped() <-chan struct{} { return s.life.Stopped() }

func (s *Sweeper) loop(ctx context.Context) {
	defer s.life.Done()
	log := s.cfg.Logger.With("component", "outbox_sweeper")
	ticker := time.NewTicker(s.cfg.Interval)
	defer ticker.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, sweepTimeout)
		n, err := s.Sweep(sctx)
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			// Shutting down: not an error.
		case err != nil:
			log.Warn("outbox: sweep failed", "deleted", n, "error", err)
		case n > 0:
			log.Info("outbox: swept completed intents", "deleted", n, "max_age", s.cfg.MaxAge)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
