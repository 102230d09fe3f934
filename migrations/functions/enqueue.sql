-- The fenced enqueue: the check of the epoch and the insert, atomic under
-- the resource's control-row lock. The Go client (outbox) calls these;
-- the SQL interface's enqueue (interface_v1.sql) calls fencegate_enqueue.

-- fencegate_enqueue is the fenced enqueue, one call, one round trip (the Go
-- client's, and enqueue's below the SQL interface's checks). It runs as a
-- function (not a single CTE statement) because under READ COMMITTED each
-- statement in a plpgsql function takes a fresh snapshot: after the FOR
-- UPDATE below waits for a concurrent takeover or enqueue to commit, the
-- following statements see what that transaction wrote.
--
-- Outcomes: 'inserted', 'duplicate' (same resource and operation id, same
-- content: the existing intent, nothing written), 'conflict' (same operation
-- id, different content: nothing written), 'stale' (supplied epoch is not the
-- current epoch: nothing written). With p_notify, NOTIFY <schema>_intents at
-- commit.
CREATE OR REPLACE FUNCTION fencegate.fencegate_enqueue(
    p_resource text, p_epoch bigint, p_operation text, p_kind text,
    p_key text, p_fence text, p_payload jsonb, p_notify boolean,
    OUT outcome text, OUT intent_id bigint, OUT status text,
    OUT current_epoch bigint, OUT existing_epoch bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- Every statement below reaches its rows by an index, whatever the
-- tables' statistics: a session keeps the plans it made, and a plan made
-- on a young table (a new install; autovacuum analyzes at most once a
-- minute) looked an operation id up by a sequential scan, which every
-- later enqueue of the session repeated on the grown table
-- (TestEnqueueProbesOnYoungStatistics, outbox).
SET enable_seqscan = off
AS $$
DECLARE
    ex record;
BEGIN
    -- 0. The rule set (policy.sql), before the control row is locked: the
    --    principal this transaction names must be allowed the resource and
    --    the kind, and its key scope decides the effective key.
    --    Without a rule set (never applied) one probe of policy_history
    --    is all this costs (fencegate_rules, policy.sql).
    p_key := fencegate.fencegate_rules(p_resource, p_kind, p_operation, p_key, p_payload);

    -- 1. Lock the resource's control row. Every grant and advance updates
    --    this row, so holding the lock until commit means no change of
    --    authority can happen between the check below and our insert: the
    --    check and the write are one atomic step. Reading the epoch in one
    --    transaction and inserting in another would let a takeover slip in.
    SELECT r.epoch INTO current_epoch
    FROM fencegate.resources r WHERE r.resource_id = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        current_epoch := 0;  -- no epoch was ever issued: nothing is current
    END IF;

    -- 2. A retry of the same operation (a lost response) gets the intent
    --    committed the first time, whatever the epoch is now: nothing new is
    --    written, so nothing stale can slip in. Different content under the
    --    same operation id is a conflict and is never stored.
    SELECT i.intent_id, i.status, i.epoch, i.kind, i.idempotency_key, i.fence, i.payload
    INTO ex
    FROM fencegate.intents i WHERE i.resource_id = p_resource AND i.operation_id = p_operation;
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

    INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
    VALUES (p_resource, p_epoch, p_operation, p_kind, p_key, p_fence, p_payload)
    RETURNING intents.intent_id, intents.status INTO intent_id, status;
    IF p_notify THEN
        -- Delivered at commit, and only if the transaction commits. The
        -- schema's channel, <schema>_intents: the schema's name is read
        -- from a name of fencegate's, which the migration renames into the
        -- schema like every other (a schema's name holds no '.').
        PERFORM pg_notify(split_part('fencegate.intents', '.', 1) || '_intents', '');
    END IF;
    outcome := 'inserted';
END
$$;

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
-- The control rows are locked in resource id order (byte order): two batches
-- locking {a, b} and {b, a} in array order could each hold one row and wait
-- for the other (a deadlock); sorted, one simply waits for the other. ORDER BY
-- sits below FOR UPDATE in the plan, so rows are locked in sorted order. A
-- resource with no row has no current epoch (0): its items are stale and need
-- no lock. The deciding statement runs after the locks were granted, with a
-- fresh snapshot (READ COMMITTED), so its operation-id dedup sees every
-- intent committed by whoever held them before.
--
-- plan_cache_mode = force_generic_plan: each session plans the statements
-- once, not again on every call inside the critical section (a custom plan
-- for the array parameters cost more than the rest of a small batch). The
-- payloads (JSON texts) are parsed before any lock is taken. A plan made
-- once is kept while the tables grow, so the tables are reached only by
-- probes of an index, one per resource and one per operation id (lateral
-- subqueries, enable_seqscan off): planned as joins on young tables (a new
-- install; autovacuum analyzes at most once a minute) they read both
-- tables in full for every later batch of the session
-- (TestEnqueueBatchProbesOnYoungStatistics, outbox).
CREATE OR REPLACE FUNCTION fencegate.fencegate_enqueue_batch(
    p_resources text[], p_epochs bigint[], p_operations text[], p_kinds text[],
    p_keys text[], p_fences text[], p_payloads text[], p_notify boolean)
RETURNS TABLE (ord bigint, outcome text, intent_id bigint, status text,
               current_epoch bigint, existing_epoch bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    l_payloads jsonb[];
    l_ids      text[];
    l_epochs   bigint[];
BEGIN
    -- 0. Outside the locks: parse the payloads; the rule set's check of
    --    every distinct resource and kind (policy.sql; one principal for
    --    the whole batch), and its key scope.
    l_payloads := p_payloads::jsonb[];
    -- Without a rule set (never applied) one probe of policy_history is
    -- all this costs; with one, each intent as fencegate_enqueue checks
    -- it (the principal, its key scope, the destinations).
    IF fencegate.fencegate_rule_set_applied() THEN
        p_keys := ARRAY(SELECT fencegate.fencegate_rules(u.r, u.k, u.o, u.key, u.p)
                        FROM unnest(p_resources, p_kinds, p_operations, p_keys, l_payloads) WITH ORDINALITY AS u(r, k, o, key, p, n)
                        ORDER BY u.n);
    END IF;

    -- 1. Lock every distinct resource's control row, in resource id order
    --    (byte order), and read its epoch from the locked row version. See
    --    above for why the order matters and why a resource with no row
    --    needs no lock.
    --    Each row by its own probe of the primary key, in the sorted
    --    order of the outer list (a nested loop keeps it): a join of the
    --    whole table, the generic plan made while the table was small,
    --    read every resource for every batch once it had grown.
    SELECT coalesce(array_agg(s.resource_id), '{}'), coalesce(array_agg(s.epoch), '{}')
    INTO l_ids, l_epochs
    FROM (SELECT d0.id FROM (SELECT DISTINCT u.id FROM unnest(p_resources) AS u(id)) d0
          ORDER BY d0.id COLLATE "C") d
    CROSS JOIN LATERAL (
          SELECT r.resource_id, r.epoch
          FROM fencegate.resources r
          WHERE r.resource_id = d.id
          FOR UPDATE) s;

    -- 2. One set-based statement decides and inserts, with a fresh snapshot
    --    taken after the locks above were granted (see above).
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
        --    Each operation id by its own probe of an index (the unique
        --    one; on young statistics the planner may take the resource's,
        --    which reads that resource's intents): the LIMIT keeps the
        --    lateral subquery from being planned as a join of the table.
        SELECT i.intent_id, i.resource_id, i.operation_id, i.status, i.epoch,
               i.kind, i.idempotency_key, i.fence, i.payload
        FROM (SELECT DISTINCT items.resource_id, items.operation_id FROM items) k
        CROSS JOIN LATERAL (
            SELECT x.intent_id, x.resource_id, x.operation_id, x.status, x.epoch,
                   x.kind, x.idempotency_key, x.fence, x.payload
            FROM fencegate.intents x
            WHERE x.resource_id = k.resource_id AND x.operation_id = k.operation_id
            LIMIT 1) i
    ), cand AS (
        -- 4. The fence: per new operation id, the first item whose epoch is
        --    the current one is inserted.
        SELECT DISTINCT ON (j.resource_id, j.operation_id) j.*
        FROM j
        WHERE j.epoch = j.cur_epoch
          AND NOT EXISTS (SELECT 1 FROM ex WHERE ex.resource_id = j.resource_id AND ex.operation_id = j.operation_id)
        ORDER BY j.resource_id, j.operation_id, j.ord
    ), ins AS (
        INSERT INTO fencegate.intents (resource_id, epoch, operation_id, kind, idempotency_key, fence, payload)
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
        -- Delivered at commit, and only if the transaction commits. The
        -- schema's channel, as in fencegate_enqueue.
        PERFORM pg_notify(split_part('fencegate.intents', '.', 1) || '_intents', '');
    END IF;
END
$$;
