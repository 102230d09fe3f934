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


-- fencegate_enqueue is the fenced enqueue, one call, one round trip. It runs
-- as a function (not a single CTE statement) because under READ COMMITTED
-- each statement in a plpgsql function takes a fresh snapshot: after the
-- FOR UPDATE below waits for a concurrent takeover or enqueue to commit, the
-- following statements see what that transaction wrote.
--
-- Outcomes: 'inserted', 'duplicate' (same resource and operation id, same
-- content: the existing intent, nothing written), 'conflict' (same operation
-- id, different content: nothing written), 'stale' (supplied epoch is not the
-- current epoch: nothing written).
-- +goose StatementBegin
CREATE FUNCTION fencegate_enqueue(
    p_resource text, p_epoch bigint, p_operation text, p_kind text,
    p_key text, p_fence text, p_payload jsonb, p_notify boolean,
    OUT outcome text, OUT intent_id bigint, OUT status text,
    OUT current_epoch bigint, OUT existing_epoch bigint)
LANGUAGE plpgsql AS $$
DECLARE
    ex record;
BEGIN
    -- 1. Lock the resource's control row. Every grant and advance updates
    --    this row, so holding the lock until commit means no change of
    --    authority can happen between the check below and our insert: the
    --    check and the write are one atomic step. Reading the epoch in one
    --    transaction and inserting in another would let a takeover slip in.
    SELECT r.epoch INTO current_epoch
    FROM resources r WHERE r.resource_id = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        current_epoch := 0;  -- no epoch was ever issued: nothing is current
    END IF;

    -- 2. A retry of the same operation (a lost response) gets the intent
    --    committed the first time, whatever the epoch is now: nothing new is
    --    written, so nothing stale can slip in. Different content under the
    --    same operation id is a conflict and is never stored.
    SELECT i.intent_id, i.status, i.epoch, i.kind, i.idempotency_key, i.fence, i.payload
    INTO ex
    FROM intents i WHERE i.resource_id = p_resource AND i.operation_id = p_operation;
    IF FOUND THEN
        intent_id := ex.intent_id;
        status := ex.status;
        existing_epoch := ex.epoch;
        IF ex.kind = p_kind AND ex.idempotency_key = p_key AND ex.fence = p_fence AND ex.payload = p_payload THEN
            outcome := 'duplicate';
        ELSE
            outcome := 'conflict';
        END IF;
        RETURN;
    END IF;

    -- 3. The fence: only the current epoch may commit a new intent.
    IF p_epoch <> current_epoch THEN
        outcome := 'stale';
        RETURN;
    END IF;

    INSERT INTO intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
    VALUES (p_resource, p_epoch, p_operation, p_kind, p_key, p_fence, p_payload)
    RETURNING intents.intent_id, intents.status INTO intent_id, status;
    IF p_notify THEN
        -- Delivered at commit, and only if the transaction commits.
        PERFORM pg_notify('fencegate_intents', '');
    END IF;
    outcome := 'inserted';
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE intents;
DROP TABLE resources;
DROP FUNCTION fencegate_epoch_never_decreases();
DROP FUNCTION fencegate_enqueue(text, bigint, text, text, text, text, jsonb, boolean);
