-- +goose Up

-- fencegate_enqueue_batch, same signature, same outcomes, same locks as in
-- 00006_enqueue_batch.sql; only what the control-row locks are held across
-- gets shorter. The batch's locks are held until commit, so concurrent
-- batches over overlapping resources run one after the other, and the time
-- from the first lock to the commit is what bounds their throughput. Found
-- with pg_stat_statements and auto_explain (issue: enqueue-batch and
-- enqueue-group below their goals):
--
-- 1. The main statement was planned anew on every call, after the locks
--    were taken (plan_cache_mode auto kept choosing custom plans for the
--    array parameters): 0.67 ms of planning per call inside the critical
--    section, and most of a small group-commit batch's cost. The function now
--    runs with plan_cache_mode = force_generic_plan, so each session plans
--    its statements once. The generic plans are the ones wanted for any
--    batch size: unnest's rows hash-joined, the operation-id lookup a nested
--    loop over intents_resource_operation_key, the control rows found
--    through their primary key (or a scan of a small table).
-- 2. The lock statement filtered resources with `= ANY(array)`, which in a
--    generic plan compares every row against every element; it now joins the
--    batch's distinct resource ids. Still FOR UPDATE, still ORDER BY
--    resource_id COLLATE "C" below the LockRows node: locks are taken in
--    sorted order, so overlapping batches cannot deadlock.
-- 3. The payloads are parsed (text to jsonb) before the locks are taken, not
--    inside the deciding statement. An invalid payload still fails the call
--    as a whole (class 22), before it has locked anything.
--
-- Unchanged: each item is fenced by the epoch read from its resource's
-- locked row version; the dedup lookup runs in a statement whose snapshot
-- is taken after the locks were granted (READ COMMITTED), so it sees every
-- intent committed by whoever held them before; per-item outcomes and their
-- in-batch order semantics (see 00006) are the same statement as before.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_enqueue_batch(
    p_resources text[], p_epochs bigint[], p_operations text[], p_kinds text[],
    p_keys text[], p_fences text[], p_payloads text[], p_notify boolean)
RETURNS TABLE (ord bigint, outcome text, intent_id bigint, status text,
               current_epoch bigint, existing_epoch bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    l_payloads jsonb[];
    l_ids      text[];
    l_epochs   bigint[];
BEGIN
    -- 0. Outside the locks: parse the payloads.
    l_payloads := p_payloads::jsonb[];

    -- 1. Lock every distinct resource's control row, in resource id order
    --    (byte order), and read its epoch from the locked row version. See
    --    00006 for why the order matters and why a resource with no row
    --    needs no lock.
    SELECT coalesce(array_agg(s.resource_id), '{}'), coalesce(array_agg(s.epoch), '{}')
    INTO l_ids, l_epochs
    FROM (SELECT r.resource_id, r.epoch
          FROM resources r
          JOIN (SELECT DISTINCT u.id FROM unnest(p_resources) AS u(id)) d ON d.id = r.resource_id
          ORDER BY r.resource_id COLLATE "C"
          FOR UPDATE OF r) s;

    -- 2. One set-based statement decides and inserts, with a fresh snapshot
    --    taken after the locks above were granted (see 00006).
    RETURN QUERY
    WITH items AS (
        SELECT t.resource_id, t.epoch, t.operation_id, t.kind, t.idempotency_key, t.fence,
               t.payload, t.ord
        FROM unnest(p_resources, p_epochs, p_operations, p_kinds, p_keys, p_fences, l_payloads)
             WITH ORDINALITY AS t(resource_id, epoch, operation_id, kind, idempotency_key, fence, payload, ord)
    ), locked AS (
        SELECT l.resource_id, l.epoch FROM unnest(l_ids, l_epochs) AS l(resource_id, epoch)
    ), j AS (
        SELECT it.*, coalesce(lk.epoch, 0) AS cur_epoch
        FROM items it LEFT JOIN locked lk ON lk.resource_id = it.resource_id
    ), ex AS (
        -- 3. Retries of operations committed earlier: duplicate or conflict,
        --    whatever the epoch is now (a retry writes nothing).
        SELECT i.intent_id, i.resource_id, i.operation_id, i.status, i.epoch,
               i.kind, i.idempotency_key, i.fence, i.payload
        FROM intents i
        JOIN (SELECT DISTINCT items.resource_id, items.operation_id FROM items) k
          ON i.resource_id = k.resource_id AND i.operation_id = k.operation_id
    ), cand AS (
        -- 4. The fence: per new operation id, the first item whose epoch is
        --    the current one is inserted.
        SELECT DISTINCT ON (j.resource_id, j.operation_id) j.*
        FROM j
        WHERE j.epoch = j.cur_epoch
          AND NOT EXISTS (SELECT 1 FROM ex WHERE ex.resource_id = j.resource_id AND ex.operation_id = j.operation_id)
        ORDER BY j.resource_id, j.operation_id, j.ord
    ), ins AS (
        INSERT INTO intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
        SELECT c.resource_id, c.epoch, c.operation_id, c.kind, c.idempotency_key, c.fence, c.payload
        FROM cand c ORDER BY c.ord
        RETURNING intents.intent_id, intents.resource_id, intents.operation_id, intents.status
    )
    SELECT j.ord,
        CASE
            WHEN ex.intent_id IS NOT NULL THEN
                CASE WHEN ex.kind = j.kind AND ex.idempotency_key = j.idempotency_key
                          AND ex.fence = j.fence AND ex.payload = j.payload
                     THEN 'duplicate' ELSE 'conflict' END
            WHEN c.ord IS NULL OR j.ord < c.ord THEN 'stale'
            WHEN j.ord = c.ord THEN 'inserted'
            WHEN c.kind = j.kind AND c.idempotency_key = j.idempotency_key
                 AND c.fence = j.fence AND c.payload = j.payload THEN 'duplicate'
            ELSE 'conflict'
        END,
        CASE WHEN ex.intent_id IS NOT NULL THEN ex.intent_id
             WHEN c.ord IS NOT NULL AND j.ord >= c.ord THEN ins.intent_id END,
        CASE WHEN ex.intent_id IS NOT NULL THEN ex.status
             WHEN c.ord IS NOT NULL AND j.ord >= c.ord THEN ins.status END,
        j.cur_epoch,
        CASE WHEN ex.intent_id IS NOT NULL THEN ex.epoch
             WHEN c.ord IS NOT NULL AND j.ord > c.ord THEN c.epoch END
    FROM j
    LEFT JOIN ex ON ex.resource_id = j.resource_id AND ex.operation_id = j.operation_id
    LEFT JOIN cand c ON c.resource_id = j.resource_id AND c.operation_id = j.operation_id
    LEFT JOIN ins ON ins.resource_id = j.resource_id AND ins.operation_id = j.operation_id
    ORDER BY j.ord;

    IF p_notify THEN
        -- Delivered at commit, and only if the transaction commits.
        PERFORM pg_notify('fencegate_intents', '');
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The body of 00006_enqueue_batch.sql.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_enqueue_batch(
    p_resources text[], p_epochs bigint[], p_operations text[], p_kinds text[],
    p_keys text[], p_fences text[], p_payloads text[], p_notify boolean)
RETURNS TABLE (ord bigint, outcome text, intent_id bigint, status text,
               current_epoch bigint, existing_epoch bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    l_ids    text[];
    l_epochs bigint[];
BEGIN
    -- 1. Lock every distinct resource's control row, in resource id order,
    --    and read its epoch from the locked row version. The fixed order
    --    matters: two batches locking {a, b} and {b, a} in array order could
    --    each hold one row and wait for the other (a deadlock, which
    --    PostgreSQL breaks by aborting one of them); sorted, every batch
    --    takes the locks in the same order, so one simply waits for the
    --    other. (Single enqueues and lease grants lock one row only.)
    --    ORDER BY sits below FOR UPDATE in the plan, so rows are locked in
    --    sorted order. COLLATE "C": byte order, independent of the locale.
    --    As in fencegate_enqueue, holding these locks until commit means no
    --    change of authority can fall between the check below and the
    --    insert; a resource with no row has no current epoch (0), so its
    --    items are stale and need no lock.
    SELECT coalesce(array_agg(s.resource_id), '{}'), coalesce(array_agg(s.epoch), '{}')
    INTO l_ids, l_epochs
    FROM (SELECT r.resource_id, r.epoch FROM resources r
          WHERE r.resource_id = ANY(p_resources)
          ORDER BY r.resource_id COLLATE "C"
          FOR UPDATE) s;

    -- 2. One set-based statement decides and inserts. Under READ COMMITTED
    --    it takes a fresh snapshot after the locks above were granted, so it
    --    sees every intent committed by whoever held them before us: the
    --    operation-id dedup cannot miss a concurrent enqueue of the same id
    --    on the same resource.
    RETURN QUERY
    WITH items AS (
        SELECT t.resource_id, t.epoch, t.operation_id, t.kind, t.idempotency_key, t.fence,
               t.payload::jsonb AS payload, t.ord
        FROM unnest(p_resources, p_epochs, p_operations, p_kinds, p_keys, p_fences, p_payloads)
             WITH ORDINALITY AS t(resource_id, epoch, operation_id, kind, idempotency_key, fence, payload, ord)
    ), locked AS (
        SELECT l.resource_id, l.epoch FROM unnest(l_ids, l_epochs) AS l(resource_id, epoch)
    ), j AS (
        SELECT it.*, coalesce(lk.epoch, 0) AS cur_epoch
        FROM items it LEFT JOIN locked lk ON lk.resource_id = it.resource_id
    ), ex AS (
        -- 3. Retries of operations committed earlier: duplicate or conflict,
        --    whatever the epoch is now (a retry writes nothing).
        SELECT i.intent_id, i.resource_id, i.operation_id, i.status, i.epoch,
               i.kind, i.idempotency_key, i.fence, i.payload
        FROM intents i
        JOIN (SELECT DISTINCT items.resource_id, items.operation_id FROM items) k
          ON i.resource_id = k.resource_id AND i.operation_id = k.operation_id
    ), cand AS (
        -- 4. The fence: per new operation id, the first item whose epoch is
        --    the current one is inserted.
        SELECT DISTINCT ON (j.resource_id, j.operation_id) j.*
        FROM j
        WHERE j.epoch = j.cur_epoch
          AND NOT EXISTS (SELECT 1 FROM ex WHERE ex.resource_id = j.resource_id AND ex.operation_id = j.operation_id)
        ORDER BY j.resource_id, j.operation_id, j.ord
    ), ins AS (
        INSERT INTO intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
        SELECT c.resource_id, c.epoch, c.operation_id, c.kind, c.idempotency_key, c.fence, c.payload
        FROM cand c ORDER BY c.ord
        RETURNING intents.intent_id, intents.resource_id, intents.operation_id, intents.status
    )
    SELECT j.ord,
        CASE
            WHEN ex.intent_id IS NOT NULL THEN
                CASE WHEN ex.kind = j.kind AND ex.idempotency_key = j.idempotency_key
                          AND ex.fence = j.fence AND ex.payload = j.payload
                     THEN 'duplicate' ELSE 'conflict' END
            WHEN c.ord IS NULL OR j.ord < c.ord THEN 'stale'
            WHEN j.ord = c.ord THEN 'inserted'
            WHEN c.kind = j.kind AND c.idempotency_key = j.idempotency_key
                 AND c.fence = j.fence AND c.payload = j.payload THEN 'duplicate'
            ELSE 'conflict'
        END,
        CASE WHEN ex.intent_id IS NOT NULL THEN ex.intent_id
             WHEN c.ord IS NOT NULL AND j.ord >= c.ord THEN ins.intent_id END,
        CASE WHEN ex.intent_id IS NOT NULL THEN ex.status
             WHEN c.ord IS NOT NULL AND j.ord >= c.ord THEN ins.status END,
        j.cur_epoch,
        CASE WHEN ex.intent_id IS NOT NULL THEN ex.epoch
             WHEN c.ord IS NOT NULL AND j.ord > c.ord THEN c.epoch END
    FROM j
    LEFT JOIN ex ON ex.resource_id = j.resource_id AND ex.operation_id = j.operation_id
    LEFT JOIN cand c ON c.resource_id = j.resource_id AND c.operation_id = j.operation_id
    LEFT JOIN ins ON ins.resource_id = j.resource_id AND ins.operation_id = j.operation_id
    ORDER BY j.ord;

    IF p_notify THEN
        -- Delivered at commit, and only if the transaction commits. (Sent
        -- even when nothing was inserted: a spurious wake-up costs one
        -- empty claim.)
        PERFORM pg_notify('fencegate_intents', '');
    END IF;
END
$$;
-- +goose StatementEnd
