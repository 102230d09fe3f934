-- +goose Up

-- fencegate_enqueue_batch is the fenced enqueue of many intents in one call,
-- one round trip and one transaction (outbox.EnqueueBatch and group commit).
-- Each item gets exactly the outcome it would get from fencegate_enqueue run
-- alone, in array order: 'inserted', 'duplicate', 'conflict' or 'stale'. A
-- stale or conflicting item stores nothing and does not affect the others.
--
-- Items with the same resource and operation id inside one batch behave as
-- if enqueued one after the other: items before the first one whose epoch is
-- current are stale, that one is inserted, later ones are duplicates of it
-- (same content) or conflicts.
--
-- p_payloads are JSON texts (validated by the caller), cast here.
-- +goose StatementBegin
CREATE FUNCTION fencegate_enqueue_batch(
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

-- +goose Down
DROP FUNCTION fencegate_enqueue_batch(text[], bigint[], text[], text[], text[], text[], text[], boolean);
