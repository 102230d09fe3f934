-- +goose Up

-- Issue 13 ("production stays production"). Migration 00010 put a fault
-- test's failpoint into fencegate_enqueue for every database. It is taken
-- out again: the same function, the same body, without the failpoint. The
-- fault test that pauses an enqueue between the epoch check and the insert
-- installs 00010's version again in its own database (test/article).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_enqueue(
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_enqueue(
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

    -- Failpoint (fault tests only): a session that set
    -- fencegate.failpoint = 'between_check_and_insert' waits here, after
    -- the check passed and with the control row still locked, until it can
    -- take the advisory lock the test holds (internal/failpoint). In every
    -- other session this costs one current_setting() lookup of an unset
    -- placeholder, nanoseconds beside the row lock and the insert.
    IF current_setting('fencegate.failpoint', true) = 'between_check_and_insert' THEN
        PERFORM pg_advisory_lock(439788397413);
        PERFORM pg_advisory_unlock(439788397413);
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
