package idempotency

import (
	"context"
	"fmt"
	"time"

	"github.com/fencegate/fencegate/internal/startstop"
)

// sweepTimeout bounds one Sweep run of a Sweeper.
const sweepTimeout = time.Minute

// sweepSQL deletes up to $2 completed keys whose completion is older than
// $1 (see sweepOnce).
const sweepSQL = `
		WITH old AS (
			SELECT kind, idempotency_key FROM fencegate.idempotency_keys
			WHERE created_at < now() - $1::interval
			  AND state = 'completed' AND completed_at < now() - $1::interval
			ORDER BY created_at
			LIMIT $2
			FOR UPDATE SKIP LOCKED)
		DELETE FROM fencegate.idempotency_keys k
		USING old
		WHERE k.kind = old.kind AND k.idempotency_key = old.idempotency_key`

// sweepOnce deletes at most SweepBatch completed keys older than Retention
// and returns how many it deleted. It is one statement, so it commits on its
// own and holds its row locks only for the batch.
//
// FOR UPDATE SKIP LOCKED: the rows are locked in the same statement that
// deletes them, so none can change between being chosen and being deleted,
// and a key a Begin holds locked right now is skipped (left for the next
// sweep) instead of making the sweep wait. Started and held keys are never
// chosen: only completed ones are safe to forget.
//
// The scan walks idempotency_keys_created_idx: a key completed before the
// cutoff was created before it, so the created_at bound drops nothing the
// completed_at one keeps, and unlike completed_at and state, created_at
// never changes, which leaves the completing update free to be HOT (see
// migration 00026).
func (s *Store) sweepOnce(ctx context.Context) (int, error) {
	tag, err := s.pool.Exec(ctx, s.schema.SQL(sweepSQL),
		interval(s.cfg.Retention), s.cfg.SweepBatch)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// Sweep deletes completed keys whose completion is older than Retention, in
// batches of SweepBatch, each its own short transaction, until none is left
// or ctx ends, and returns how many it deleted. Started and held keys are
// never deleted.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := s.sweepOnce(ctx)
		total += n
		if err != nil {
			return total, fmt.Errorf("idempotency: sweep: %w", err)
		}
		if n < s.cfg.SweepBatch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("idempotency: sweep: %w", err)
		}
	}
}

// Sweeper runs Sweep every Config.SweepInterval, first right after Start.
type Sweeper struct {
	store *Store

	// life is the sweeper's Start/Stop (internal/startstop).
	life startstop.Lifecycle
}

// NewSweeper returns a Sweeper of store's keys, not started.
func NewSweeper(store *Store) *Sweeper {
	return &Sweeper{store: store}
}

// Start starts sweeping in the background and returns once it runs. The
// sweeper stops when ctx ends or Stop is called. A Sweeper starts once.
func (w *Sweeper) Start(ctx context.Context) error {
	ctx, err := w.life.Start(ctx, "idempotency: sweeper")
	if err != nil {
		return err
	}
	go w.loop(ctx)
	return nil
}

// Stop stops the sweeper and waits for its current sweep to end.
// Before Start it marks the sweeper stopped: it never runs.
func (w *Sweeper) Stop() { w.life.Stop() }

// Stopped is closed once the sweeper has stopped.
func (w *Sweeper) Stopped() <-chan struct{} { return w.life.Stopped() }

func (w *Sweeper) loop(ctx context.Context) {
	defer w.life.Done()
	cfg := w.store.cfg
	ticker := time.NewTicker(cfg.SweepInterval)
	defer ticker.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, sweepTimeout)
		n, err := w.store.Sweep(sctx)
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			// Shutting down: not an error.
		case err != nil:
			cfg.Logger.Warn("idempotency: sweep failed", "deleted", n, "error", err)
		case n > 0:
			cfg.Logger.Info("idempotency: swept completed keys", "deleted", n, "retention", cfg.Retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
