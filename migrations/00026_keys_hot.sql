-- +goose NO TRANSACTION
-- +goose Up

-- Completing a key (state started → completed, its outcome, completed_at)
-- can be a HOT update: a new row version on the same page, no new index
-- entries. For that no indexed column may change — a column in a partial
-- index's predicate counts — and the page needs room for the new version.
--
-- The sweeper's work list was a partial index on completed_at WHERE state
-- = 'completed': every completion changed both, so every completion wrote
-- a new entry into it and into the primary key. The sweeper now walks
-- created_at, which never changes after the insert: a key completed before
-- the retention's cutoff was created before it too, so
--   created_at < cutoff AND state = 'completed' AND completed_at < cutoff
-- selects exactly the keys the old condition did. The scan also passes the
-- old keys that are started or held (never swept); there are few of them,
-- the held ones waiting for an operator.
--
-- fillfactor 50 leaves room on each page for the completed versions of
-- the keys begun on it (70 left too little: a third of the completions
-- found no room on their page).
--
-- CONCURRENTLY (hence no transaction): building the index must not block
-- the Begins of a large key table. Idempotent.
ALTER TABLE idempotency_keys SET (fillfactor = 50);
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_created_idx ON idempotency_keys (created_at);
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_sweep_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS idempotency_keys_sweep_idx ON idempotency_keys (completed_at)
    WHERE state = 'completed';
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_created_idx;
ALTER TABLE idempotency_keys RESET (fillfactor);
