package idempotency

import "context"

// SweepOnce exposes one sweep batch to the tests.
func (s *Store) SweepOnce(ctx context.Context) (int, error) { return s.sweepOnce(ctx) }

// SweepSQL is the sweeper's statement, for the tests' EXPLAIN.
const SweepSQL = sweepSQL
