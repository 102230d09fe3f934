package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencegate/fencegate/policy"
)

// BatchResult is the answer for one intent of EnqueueBatch: Result when Err
// is nil; otherwise Err says why that intent was not stored
// (*StaleEpochError, *ConflictError, *ValidationError).
type BatchResult struct {
	Result
	Err error
}

// EnqueueBatch commits many intents in one transaction and one round trip.
// Each intent is validated, fenced by its own epoch and deduplicated by its
// own operation id exactly as Enqueue would do it: a stale, conflicting or
// invalid intent (Validate's checks) is rejected alone, in its
// BatchResult, and the others commit. Intents with the same resource and
// operation id in one batch are handled as if enqueued one after the
// other, in slice order.
//
// The results are in the order of intents. The error is non-nil only when
// the batch as a whole failed; then nothing of it committed, unless the
// error hides whether the commit happened (a lost connection), in which
// case retrying the batch is safe: committed intents come back as
// duplicates. Under a rule set (package policy) an intent the principal
// may not make — a resource or kind outside its scope
// (*fenceerr.ForbiddenError), a destination outside its rules
// (*ValidationError naming the payload's field) — refuses the whole batch,
// which does not say which intent it was; a *BusyError (LockTimeout) does
// too.
//
// The batch locks the control rows of all its resources until it commits,
// in resource id order (see migrations/functions/enqueue.sql): keep
// batches to hundreds of intents, not millions.
func (c *Client) EnqueueBatch(ctx context.Context, intents []Intent) ([]BatchResult, error) {
	notify := c.notify.claim()
	res, inserted, err := c.enqueueBatch(ctx, c.pool, intents, c.principal(ctx), notify, true)
	if !notify && (inserted || (err != nil && !isServerError(err))) {
		c.notify.suppressed()
	}
	for _, r := range res {
		c.countStale(r.Err)
	}
	return res, err
}

// EnqueueBatchTx is EnqueueBatch inside the caller's transaction, which
// holds the control rows of the batch's resources locked until it ends. See
// EnqueueTx.
func (c *Client) EnqueueBatchTx(ctx context.Context, tx pgx.Tx, intents []Intent) ([]BatchResult, error) {
	res, _, err := c.enqueueBatch(ctx, tx, intents, c.principal(ctx), !c.cfg.DisableNotify, false)
	for _, r := range res {
		c.countStale(r.Err)
	}
	return res, err
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// batchArgs holds the column arrays of fencegate_enqueue_batch.
type batchArgs struct {
	resources, operations, kinds, keys, fences, payloads []string
	epochs                                               []int64
}

func (b *batchArgs) add(in Intent) {
	b.resources = append(b.resources, in.Resource)
	b.epochs = append(b.epochs, in.Epoch)
	b.operations = append(b.operations, in.OperationID)
	b.kinds = append(b.kinds, in.Kind)
	b.keys = append(b.keys, in.IdempotencyKey)
	b.fences = append(b.fences, string(in.Fence))
	b.payloads = append(b.payloads, string(in.Payload))
}

func (b *batchArgs) args(notify bool) []any {
	return []any{b.resources, b.epochs, b.operations, b.kinds, b.keys, b.fences, b.payloads, notify}
}

// enqueueBatch validates intents and runs the valid ones through
// fencegate_enqueue_batch; inserted reports whether any was inserted. own
// says the statement is its own transaction (q is the pool), which takes
// the client's LockTimeout.
func (c *Client) enqueueBatch(ctx context.Context, q querier, intents []Intent, principal string, notify, own bool) (results []BatchResult, inserted bool, err error) {
	results = make([]BatchResult, len(intents))
	valid := make([]Intent, 0, len(intents))
	index := make([]int, 0, len(intents)) // position in intents of valid[i]
	for i, in := range intents {
		n, err := c.Validate(in)
		if err != nil {
			results[i].Err = err
			continue
		}
		valid = append(valid, n)
		index = append(index, i)
	}
	if len(valid) == 0 {
		return results, false, nil
	}
	answers, err := c.runBatch(ctx, q, valid, principal, notify, own)
	if err != nil {
		return nil, false, err
	}
	for k, a := range answers {
		results[index[k]] = a
		if a.Err == nil && !a.Duplicate {
			inserted = true
		}
	}
	return results, inserted, nil
}

// runBatch runs validated intents in one call of fencegate_enqueue_batch and
// returns one answer per intent, in order.
func (c *Client) runBatch(ctx context.Context, q querier, valid []Intent, principal string, notify, own bool) ([]BatchResult, error) {
	var a batchArgs
	for _, in := range valid {
		a.add(in)
	}
	args := a.args(notify)
	as := 0
	if principal != "" {
		// Made as principal: the transaction's setting, which the intents
		// record and the rule set's check reads.
		as, args = 1, append(args, principal)
	}
	bounded, waited := c.lockBound(own)
	if bounded == 1 {
		args = append(args, lockTimeoutSetting(waited))
	}
	rows, err := q.Query(ctx, c.schema.SQL(enqueueBatchStatements[as][bounded]), args...)
	if err != nil {
		return nil, batchError(err, waited)
	}
	answers := make([]BatchResult, len(valid))
	seen := 0
	// CollectRows reads to the end of the statement, so with the pool (an
	// implicit transaction) an error at commit is returned here and no
	// answer is handed out for a batch that did not commit.
	_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{}, error) {
		var (
			ord     int64
			outcome string
			id      *int64
			status  *string
			current int64
		)
		if err := r.Scan(&ord, &outcome, &id, &status, &current); err != nil {
			return struct{}{}, err
		}
		if ord < 1 || int(ord) > len(valid) {
			return struct{}{}, fmt.Errorf("row for item %d of %d", ord, len(valid))
		}
		res, err := outcomeResult(valid[ord-1], outcome, id, status, current)
		answers[ord-1] = BatchResult{Result: res, Err: err}
		seen++
		return struct{}{}, nil
	})
	if err != nil {
		return nil, batchError(err, waited)
	}
	if seen != len(valid) {
		return nil, fmt.Errorf("outbox: enqueue batch: %d answers for %d intents", seen, len(valid))
	}
	return answers, nil
}

// batchError is a failed batch statement's error for the caller; waited
// is the lock_timeout it ran under (0: none of ours).
func batchError(err error, waited time.Duration) error {
	if f := policy.Refusal(err); f != err {
		// The whole batch is refused (nothing committed); the PostgreSQL
		// error stays in the chain, so isServerError still says so.
		return f
	}
	if b, ok := busy(err, "", waited); ok {
		return b
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		// Only reachable outside READ COMMITTED: another transaction
		// committed one of the operation ids after our snapshot.
		return fmt.Errorf("outbox: enqueue batch: an operation id was committed concurrently; retry: %w", err)
	}
	return fmt.Errorf("outbox: enqueue batch: %w", err)
}

// isServerError reports whether PostgreSQL rejected the statement: then,
// run as its own transaction, it did not commit.
func isServerError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}
