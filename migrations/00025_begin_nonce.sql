-- +goose Up

-- begin_nonce: a number the adapter runtime chose for the Begin that
-- created (or last took) an idempotency key. When the answer to a Begin is
-- lost (the primary failed over while it committed), the runtime passes
-- that number on its next Begin of the same intent: a key still started by
-- that very Begin, owned by the intent, with no I/O declared, was never
-- acted on (the runtime never had its decision) and is taken back at once
-- instead of waiting for its lock to expire (idempotency.BeginOptions).
-- NULL: a Begin that chose none (an older build, a program's own caller).
ALTER TABLE idempotency_keys ADD COLUMN begin_nonce bigint;
