-- +goose Up

-- Counters of what workers outside the gateway's processes do, kept in
-- PostgreSQL so that a scrape of the relay's processes sees them
-- (fencegate_fence_refusals_total, fencegate_worker_lease_takeovers_total:
-- gateway/intentmetrics.go). A worker using the SQL interface (path sql)
-- or the CLI (path cli) has no /metrics of its own, and a refusal rolls
-- back the refusing transaction, so a counter in a table would be rolled
-- back with it: each counter is a sequence, which nextval() advances
-- outside any transaction (a rolled-back nextval stays taken). A gap in a
-- sequence never matters here; its value is the count.
--
-- Refusals, fence_count_<path>_<reason>: stale_epoch (ZF002), lease_held
-- (ZF005), forbidden (ZF006, ZF007: the rule set). Grants,
-- fence_count_<path>_takeover_<how>: each new epoch by how (free,
-- after_expiry, released, reacquired; external_advance by the CLI's epoch
-- advance). Bumped by fencegate_count (functions/counters.sql) from the
-- SQL interface's functions, which run as their owner: a worker's role
-- needs no right on them.
--
-- No index was added for the admin list's search (operation id,
-- idempotency key, destination): every change of an intent's status is a
-- non-HOT update that writes an entry into every index of intents, so an
-- index for an operator's occasional search would be paid on every settle.
-- The search runs within the other filters (a status's partial index, a
-- resource's index) or reads the outbox newest first until a page is full.
CREATE SEQUENCE fence_count_sql_stale_epoch;
CREATE SEQUENCE fence_count_sql_lease_held;
CREATE SEQUENCE fence_count_sql_forbidden;
CREATE SEQUENCE fence_count_sql_takeover_free;
CREATE SEQUENCE fence_count_sql_takeover_after_expiry;
CREATE SEQUENCE fence_count_sql_takeover_released;
CREATE SEQUENCE fence_count_sql_takeover_reacquired;
CREATE SEQUENCE fence_count_cli_stale_epoch;
CREATE SEQUENCE fence_count_cli_lease_held;
CREATE SEQUENCE fence_count_cli_forbidden;
CREATE SEQUENCE fence_count_cli_takeover_free;
CREATE SEQUENCE fence_count_cli_takeover_after_expiry;
CREATE SEQUENCE fence_count_cli_takeover_released;
CREATE SEQUENCE fence_count_cli_takeover_reacquired;
CREATE SEQUENCE fence_count_cli_takeover_external_advance;

-- +goose Down
DROP SEQUENCE fence_count_sql_stale_epoch, fence_count_sql_lease_held, fence_count_sql_forbidden,
    fence_count_sql_takeover_free, fence_count_sql_takeover_after_expiry, fence_count_sql_takeover_released,
    fence_count_sql_takeover_reacquired, fence_count_cli_stale_epoch, fence_count_cli_lease_held,
    fence_count_cli_forbidden, fence_count_cli_takeover_free, fence_count_cli_takeover_after_expiry,
    fence_count_cli_takeover_released, fence_count_cli_takeover_reacquired, fence_count_cli_takeover_external_advance;
