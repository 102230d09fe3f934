package idempotency

import "context"

// SweepOnce exposes one sweep batch to the tests.
func (s *Store) SweepOnce(ctx context.Context) (int, error) { return s.sweepOnce(ctx) }

// SweepSQL is the sweeper's statement, for the tests' EXPLAIN.
const SweepSQL = sweepSQL

// GroupBacklogs returns how many calls must wait before a further shared
// transaction starts, for the Begins and the Completes.
func (s *Store) GroupBacklogs() (begin, complete int) {
	return s.begins.Config().Backlog, s.completes.Config().Backlog
}

// GroupLockKeysSQL and GroupCompleteKeysSQL are a shared Complete's key
// statements, for the tests' EXPLAIN.
const (
	GroupLockKeysSQL     = lockKeysSQL
	GroupCompleteKeysSQL = completeKeysSQL
)

// GroupTxBeginQuery begins a shared Begin's or Complete's transaction.
var GroupTxBeginQuery = groupTxOptions.BeginQuery

// BatchFailureLevel is the level a failed shared transaction is logged at.
var BatchFailureLevel = batchFailureLevel
