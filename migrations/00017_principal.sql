-- +goose Up

-- Issue 15 (least authority). Who asked: the admin API's token name (or
-- "anonymous") on every intent and every grant it made; NULL for the ones
-- made by the CLI, a Go worker or SQL. As trace_context (00009), the
-- intent's is the default from a transaction-local setting the enqueue
-- sets (outbox.WithPrincipal), so fencegate_enqueue stays as it is. A
-- volatile default does not rewrite the table: existing rows read NULL.
ALTER TABLE intents ADD COLUMN IF NOT EXISTS principal text
    DEFAULT nullif(current_setting('fencegate.principal', true), '');
ALTER TABLE epoch_grants ADD COLUMN IF NOT EXISTS principal text;

-- +goose Down
ALTER TABLE epoch_grants DROP COLUMN IF EXISTS principal;
ALTER TABLE intents DROP COLUMN IF EXISTS principal;
