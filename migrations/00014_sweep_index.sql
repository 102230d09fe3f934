-- +goose NO TRANSACTION
-- +goose Up

-- Issue 12 (growth). The intents sweeper (outbox.Sweeper, every minute and
-- at start) looks for intents completed more than the retention ago:
--   status IN ('succeeded', 'failed', 'superseded', 'cancelled')
--   AND completed_at < now() - retention
-- No index served it (intents_status_rare_idx leaves succeeded out), so
-- every sweep was a sequential scan of the whole table: with 300,000
-- completed intents 168 ms and 36,000 buffers (EXPLAIN ANALYZE), with a
-- million the whole outbox read every minute while the pipeline runs —
-- and it finds nothing until the oldest intents reach the retention.
-- This partial index makes it a range scan that stops at once. It costs
-- one entry per completed intent (the completing update changes the
-- status, so it is never a HOT update and adds entries to the indexes
-- whose predicate the new row matches anyway).
--
-- CONCURRENTLY (hence no transaction): building it must not block the
-- enqueues of a large outbox. Idempotent.
CREATE INDEX CONCURRENTLY IF NOT EXISTS intents_sweep_idx ON intents (completed_at)
    WHERE status IN ('succeeded', 'failed', 'superseded', 'cancelled');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS intents_sweep_idx;
