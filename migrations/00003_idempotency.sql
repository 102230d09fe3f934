-- +goose Up

-- idempotency_token_seq hands out attempt tokens. One sequence for all keys,
-- so a token is never reused: not by another key, and not by the same key
-- after the sweeper deleted it and a new attempt created it again. A token
-- therefore names exactly one attempt's ownership of one key, forever, and
-- an attempt that lost ownership can never match a later owner's token.
CREATE SEQUENCE idempotency_token_seq AS bigint;

-- idempotency_keys holds one row per business idempotency key of an
-- external effect (package idempotency). The row is the linearization point
-- of every attempt to perform that effect: starting, taking over, completing
-- and releasing an attempt all lock this row.
CREATE TABLE idempotency_keys (
    kind            text        NOT NULL CHECK (octet_length(kind) BETWEEN 1 AND 64),
    idempotency_key text        NOT NULL CHECK (octet_length(idempotency_key) BETWEEN 1 AND 255),
    -- fingerprint is the sha256 of the effect's canonical content: the same
    -- key with a different fingerprint is a conflict, never executed.
    fingerprint     text        NOT NULL,
    -- started: an attempt owns the key until locked_until (PostgreSQL's
    --          clock); past it the attempt counts as abandoned.
    -- completed: the outcome is known and recorded (status, result).
    -- held: the outcome is unknown; no attempt owns the key and none is
    --       started automatically until an operator releases it.
    state           text        NOT NULL CHECK (state IN ('started', 'completed', 'held')),
    token           bigint      NOT NULL DEFAULT nextval('idempotency_token_seq'),
    -- owner_intent_id: the intent of the attempt that owns (started), held
    -- or completed the key. first_intent_id: the intent that created it.
    -- No foreign key: keys must outlive whatever retention intents get.
    owner_intent_id bigint      NOT NULL,
    first_intent_id bigint      NOT NULL,
    locked_until    timestamptz,
    status          text        CHECK (status IN ('succeeded', 'failed', 'unknown')),
    result          jsonb,
    last_error      text,
    attempts        integer     NOT NULL DEFAULT 1,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    PRIMARY KEY (kind, idempotency_key),
    CONSTRAINT idempotency_keys_state_fields CHECK (
        (state = 'started'   AND locked_until IS NOT NULL AND status IS NULL) OR
        (state = 'completed' AND completed_at IS NOT NULL AND status IN ('succeeded', 'failed')) OR
        (state = 'held'      AND status = 'unknown'))
);

-- The sweeper's work list: completed keys, oldest first. Partial, so started
-- and held keys (which are never swept) don't weigh on it.
CREATE INDEX idempotency_keys_sweep_idx ON idempotency_keys (completed_at) WHERE state = 'completed';

-- +goose Down
DROP TABLE idempotency_keys;
DROP SEQUENCE idempotency_token_seq;
