-- +goose Up

-- trace_context holds the W3C trace context (traceparent, tracestate as a
-- JSON object) of the span that enqueued the intent, so the dispatcher's
-- relay span and the adapter's execution span join the worker's trace.
--
-- The default reads a transaction-local setting that outbox.Enqueue sets in
-- the same statement as the enqueue (see outbox/trace.go): the fenced
-- enqueue function stays as it is, and an enqueue without a trace pays
-- nothing. current_setting is stable, not volatile, so adding the column
-- does not rewrite the table.
ALTER TABLE intents
    ADD COLUMN trace_context jsonb DEFAULT nullif(current_setting('fencegate.trace_context', true), '')::jsonb;

-- +goose Down
ALTER TABLE intents DROP COLUMN trace_context;
