-- +goose Up

-- resources holds one control row per fenced resource. The row is the
-- linearization point of everything that concerns the resource: granting a
-- lease, advancing the epoch, and committing an intent all lock this row, so
-- they are totally ordered by PostgreSQL.
CREATE TABLE resources (
    resource_id      text        PRIMARY KEY,
    -- epoch is the fencing token. It only ever grows (enforced by the
    -- trigger below, on top of the code that writes it).
    epoch            bigint      NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    holder           text,
    -- lease_expires_at is judged by PostgreSQL's clock, never a worker's.
    lease_expires_at timestamptz,
    renewed_at       timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- +goose StatementBegin
CREATE FUNCTION fencegate_epoch_never_decreases() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.epoch < OLD.epoch THEN
        RAISE EXCEPTION 'epoch of resource % would decrease from % to %',
            OLD.resource_id, OLD.epoch, NEW.epoch
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER resources_epoch_never_decreases
    BEFORE UPDATE OF epoch ON resources
    FOR EACH ROW EXECUTE FUNCTION fencegate_epoch_never_decreases();

-- intents is the outbox: one row per side effect a worker committed.
CREATE TABLE intents (
    intent_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource_id      text        NOT NULL,
    epoch            bigint      NOT NULL CHECK (epoch >= 1),
    operation_id     text        NOT NULL,
    kind             text        NOT NULL,
    idempotency_key  text        NOT NULL CHECK (octet_length(idempotency_key) <= 255),
    fence            text        NOT NULL CHECK (fence IN ('commit', 'execute')),
    payload          jsonb       NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    status           text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'relayed', 'succeeded', 'failed', 'superseded', 'unknown', 'cancelled')),
    attempts         integer     NOT NULL DEFAULT 0,
    -- relay bookkeeping for the dispatcher: a claim has an owner and an
    -- expiry, so a crashed dispatcher's claims return to the pool.
    claimed_by       text,
    claim_expires_at timestamptz,
    relay_count      integer     NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    relayed_at       timestamptz,
    completed_at     timestamptz,
    result           jsonb,
    last_error       text,
    -- Dedup of a worker's retry of the same enqueue (a lost response).
    CONSTRAINT intents_resource_operation_key UNIQUE (resource_id, operation_id)
);

-- The dispatcher's work queue: pending intents in id order. Partial, so it
-- stays as small as the backlog however large the table grows.
CREATE INDEX intents_pending_idx ON intents (intent_id) WHERE status = 'pending';

-- Relayed intents without an outcome, oldest relay first, for re-relay.
CREATE INDEX intents_relayed_idx ON intents (relayed_at) WHERE status = 'relayed';

-- Operator queries: newest first, by resource and by status.
CREATE INDEX intents_resource_idx ON intents (resource_id, intent_id DESC);
CREATE INDEX intents_status_idx ON intents (status, intent_id DESC);

-- +goose Down
DROP TABLE intents;
DROP TABLE resources;
DROP FUNCTION fencegate_epoch_never_decreases();
