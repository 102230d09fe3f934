-- +goose NO TRANSACTION
-- +goose Up

-- Issue 7 ("Make it fast"). Every status change of an intent (pending →
-- relayed by the dispatcher, relayed → succeeded/failed/… by an adapter)
-- changes an indexed column, so it is never a HOT update: PostgreSQL adds
-- an entry for the new row version to every index of the table. The
-- operators' index on (status, intent_id DESC) took one of those entries on
-- each of the two changes, for every intent, and was read only by the
-- admin list filtered by status.
--
-- It is replaced by the same index restricted to the statuses that need
-- it: failed, superseded, unknown and cancelled are rare, so without an
-- index a "newest failed intents" page would scan the whole table. The
-- other three are served without it (EXPLAIN ANALYZE, 1,000,000 intents):
--   pending   — intents_pending_idx backward, in intent_id order (0.06 ms);
--   relayed   — intents_relayed_idx and a sort of the relayed intents, a
--               set as small as what is in flight (3 ms for 1,000);
--   succeeded — the primary key backward: nearly every intent is
--               succeeded, the first rows match (0.1 ms).
-- The dispatcher's re-relay scan now uses intents_relayed_idx, which is
-- what it was made for. Neither the pending → relayed nor the relayed →
-- succeeded change writes an entry into the new index.
--
-- CONCURRENTLY (hence no transaction): on a large outbox, building an index
-- must not block the enqueues. Each statement is idempotent, so a run
-- interrupted between them is completed by the next `gateway migrate`.
CREATE INDEX CONCURRENTLY IF NOT EXISTS intents_status_rare_idx ON intents (status, intent_id DESC)
    WHERE status IN ('failed', 'superseded', 'unknown', 'cancelled');
DROP INDEX CONCURRENTLY IF EXISTS intents_status_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS intents_status_idx ON intents (status, intent_id DESC);
DROP INDEX CONCURRENTLY IF EXISTS intents_status_rare_idx;
