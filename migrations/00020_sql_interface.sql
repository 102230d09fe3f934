-- +goose Up

-- Issue 19, living in the application's database.
--
-- 1. A schema of its own. Every migration runs with search_path set to the
--    schema alone (migrations.Up), so this and every earlier migration
--    create their objects there; migrations.Up then pins every function's
--    search_path to the schema (pg_temp last), so a function called from a
--    worker's session, whose search_path leads to the application's own
--    tables (an application may well have a table called intents), still
--    reads fencegate's. The functions created here pin it themselves
--    (SET search_path FROM CURRENT: the schema, while migrating), so they
--    are never callable unpinned.
--
-- 2. Notifications per schema: two deployments in one database (two
--    schemas) must not wake each other's dispatchers and waiters. The
--    channels are <schema>_intents and <schema>_outcomes: fencegate_intents
--    and fencegate_outcomes in the default schema, as before.
--
-- 3. The namespace on NATS of a deployment in a schema other than the
--    default (or public, an install from before schemas) is derived from
--    the schema too: two schemas of one database are two deployments.
--
-- 4. A stable SQL interface for workers in any language (docs/sql.md):
--    enqueue, acquire, renew, release. Their signatures change only with a
--    major version of fencegate. They refuse with SQLSTATEs of class ZF
--    (ZF001 is the epoch authority's, migration 00019):
--      ZF002 stale_epoch   the epoch is not the resource's current one
--      ZF003 conflict      the operation id was used with other content
--      ZF004 invalid_input a field is missing or invalid (the error's
--                          COLUMN names it: "payload.to[1]")
--      ZF005 lease_held    another holder's lease is live
--    with the details as JSON in the error's DETAIL. They run with their
--    owner's rights (SECURITY DEFINER, their search_path pinned) and are
--    callable only by roles granted EXECUTE (and USAGE on the schema): a
--    worker's role needs nothing on the tables, so it can enqueue and hold
--    leases but never write an intent's status by hand. A raised error aborts
--    the caller's transaction: nothing of it is stored, the caller's own
--    writes included. The payloads of the built-in kinds are checked here
--    with the rules of their Go parsers (adapters/*/…kind) or stricter ones
--    (an email address or URL the SQL checker cannot prove valid is
--    refused: TestSQLPayloadRulesNeverLooser); other kinds are refused.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_enqueue(
    p_resource text, p_epoch bigint, p_operation text, p_kind text,
    p_key text, p_fence text, p_payload jsonb, p_notify boolean,
    OUT outcome text, OUT intent_id bigint, OUT status text,
    OUT current_epoch bigint, OUT existing_epoch bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
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
        -- Delivered at commit, and only if the transaction commits. The
        -- schema's channel (current_schema() is the pinned schema).
        PERFORM pg_notify(current_schema() || '_intents', '');
    END IF;
    outcome := 'inserted';
END
$$;
-- +goose StatementEnd

-- fencegate_enqueue_batch: 00011's, the same statement; only the channel
-- is the schema's.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_enqueue_batch(
    p_resources text[], p_epochs bigint[], p_operations text[], p_kinds text[],
    p_keys text[], p_fences text[], p_payloads text[], p_notify boolean)
RETURNS TABLE (ord bigint, outcome text, intent_id bigint, status text,
               current_epoch bigint, existing_epoch bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET search_path FROM CURRENT
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
        PERFORM pg_notify(current_schema() || '_intents', '');
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_notify_outcome() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_notify(current_schema() || '_outcomes', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- 3. The namespace: the schema joins the derivation, except for the
-- default schema and public (an install from before schemas, or moved from
-- there: its namespace, and so its stream on NATS, stays what it was).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_derived_namespace() RETURNS text
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    SELECT 'd' || substr(md5(coalesce(fencegate_deployment_sysid(), gen_random_uuid()::text) || '/' || current_database()
        || CASE WHEN current_schema() IN ('fencegate', 'public') THEN '' ELSE '/' || current_schema() END), 1, 11)
$$;
-- +goose StatementEnd

-- A derived namespace recorded by 00018 in a schema of its own is derived
-- again with the schema (only where the system identifier is readable:
-- without it the recorded one is random, so unique already).
UPDATE deployment SET namespace = fencegate_derived_namespace(), updated_at = now()
WHERE NOT explicit AND current_schema() NOT IN ('fencegate', 'public')
  AND fencegate_deployment_sysid() IS NOT NULL;

-- 4. The SQL interface.

-- interface_version: the SQL interface's major version. A worker can check
-- it at start (SELECT fencegate.interface_version() = 1): the signatures
-- and SQLSTATEs below change only when it changes.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION interface_version() RETURNS int
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$ SELECT 1 $$;
-- +goose StatementEnd

-- fencegate_raise raises an error of the interface: SQLSTATE code, the
-- message, the field named as the error's COLUMN (invalid input), and a
-- DETAIL of JSON for programs.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_raise(p_code text, p_message text, p_field text DEFAULT NULL, p_detail jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_field IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message, DETAIL = coalesce(p_detail::text, '{}');
    END IF;
    RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message, COLUMN = p_field, DETAIL = coalesce(p_detail::text, '{}');
END
$$;
-- +goose StatementEnd

-- fencegate_invalid raises ZF004 naming field: "<field>: <message>".
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_invalid(p_field text, p_message text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM fencegate_raise('ZF004', p_field || ': ' || p_message, p_field,
        jsonb_build_object('code', 'invalid_input', 'field', p_field));
END
$$;
-- +goose StatementEnd

-- fencegate_check_id checks an identifier as outbox and lease do (not
-- empty, at most p_max bytes; text can hold neither NUL nor invalid UTF-8).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_check_id(p_field text, p_value text, p_max int)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_value IS NULL OR p_value = '' THEN
        PERFORM fencegate_invalid(p_field, 'must not be empty');
    ELSIF octet_length(p_value) > p_max THEN
        PERFORM fencegate_invalid(p_field, format('must be at most %s bytes, got %s', p_max, octet_length(p_value)));
    END IF;
END
$$;
-- +goose StatementEnd

-- fencegate_payload_string reads the string field p_name of an object:
-- NULL when absent or JSON null (kindcheck.String), else it must be a
-- string.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_payload_string(p_obj jsonb, p_name text, p_field text)
RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v jsonb := p_obj -> p_name;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'string' THEN
        PERFORM fencegate_invalid(p_field, 'must be a string');
    END IF;
    RETURN v #>> '{}';
END
$$;
-- +goose StatementEnd

-- fencegate_payload_strings reads a field given as one string or an array
-- of strings (kindcheck.Strings); NULL when absent.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_payload_strings(p_obj jsonb, p_name text, p_what text)
RETURNS text[]
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v   jsonb := p_obj -> p_name;
    out text[] := '{}';
    i   int := 0;
    e   jsonb;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) = 'string' THEN
        RETURN ARRAY[v #>> '{}'];
    END IF;
    IF jsonb_typeof(v) <> 'array' THEN
        PERFORM fencegate_invalid('payload.' || p_name, format('must be %s or an array of them', p_what));
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(v) AS x LOOP
        IF jsonb_typeof(e) <> 'string' THEN
            PERFORM fencegate_invalid(format('payload.%s[%s]', p_name, i), 'must be a string');
        END IF;
        out := out || (e #>> '{}');
        i := i + 1;
    END LOOP;
    RETURN out;
END
$$;
-- +goose StatementEnd

-- fencegate_email_address_ok: whether s is an address the SQL interface
-- accepts: a plain dot-atom address (local@domain, the domain of letters,
-- digits, '-' and '.'), alone or after a display name of plain words
-- ("Ops Team <ops@example.com>"). Every such string is one net/mail parses
-- (emailkind.Address); quoted local parts, comments and encoded words are
-- not accepted here: send those through the HTTP intake or the Go client.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_email_address_ok(s text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    -- an address's words (atext), and a display name's: no '=' nor '?' in
    -- those, so never an encoded word (=?charset?…?=) that net/mail would
    -- try to decode and may refuse
    w constant text := '[A-Za-z0-9!#$%&''*+/=?^_`{|}~-]+';
    n constant text := '[A-Za-z0-9!#$%&''*+/^_`{|}~-]+';
    a constant text := w || '(\.' || w || ')*@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*';
BEGIN
    -- PL/pgSQL, not SQL: a SQL function with a SET clause is planned anew
    -- in every statement that calls it; a PL/pgSQL one once per session.
    RETURN s ~ ('^(' || n || '( ' || n || ')* <' || a || '>|' || a || ')$');
END
$$;
-- +goose StatementEnd

-- fencegate_url_ok: whether s is a URL the SQL interface accepts: http or
-- https, a host of letters, digits, '-' and '.', an optional port, a path
-- and query of unreserved and sub-delim characters and %-escapes, no
-- credentials, no fragment. Every such string passes
-- webhookkind.CheckURL (at most 2048 bytes is checked apart).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_url_ok(s text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    p constant text := '([A-Za-z0-9._~!$&''()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*';
BEGIN
    RETURN s ~ ('^https?://[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?(:[0-9]{1,5})?(/' || p || ')?(\?' || p || ')?$');
END
$$;
-- +goose StatementEnd

-- fencegate_base64_ok: canonical standard base64 with padding, no
-- whitespace: a subset of what Go's base64.StdEncoding decodes.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_base64_ok(s text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN s ~ '^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$';
END
$$;
-- +goose StatementEnd

-- fencegate_check_target: filekind.ValidateTarget, for the field p_field
-- (payload.target; payload.key for s3).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_check_target(p_field text, t text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    seg text;
BEGIN
    IF t IS NULL OR t = '' THEN
        PERFORM fencegate_invalid(p_field, 'is required');
    END IF;
    IF left(t, 1) IN ('/', '\') THEN
        PERFORM fencegate_invalid(p_field, format('must be relative, got absolute path %s', to_json(t)));
    END IF;
    IF '..' = ANY (string_to_array(t, '/')) THEN
        PERFORM fencegate_invalid(p_field, format('must not contain a ".." segment: %s', to_json(t)));
    END IF;
    -- path.Clean(t) = t and t <> '.': no empty or "." segment, no trailing
    -- slash ("a//b", "./a", "a/" and "." are refused).
    IF '' = ANY (string_to_array(t, '/')) OR '.' = ANY (string_to_array(t, '/')) THEN
        PERFORM fencegate_invalid(p_field, format('must be a clean relative file path (no empty or "." segments, no trailing slash): %s', to_json(t)));
    END IF;
    FOREACH seg IN ARRAY string_to_array(t, '/') LOOP
        -- filekind.Reserved: the adapter's own files, in any case.
        IF left(seg, 1) = '.' AND position('.fencegate.' IN lower(seg)) > 0 THEN
            PERFORM fencegate_invalid(p_field, format('segment %s is reserved for the adapter''s own files (.<name>.fencegate.*, in any case)', to_json(seg)));
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- fencegate_check_content: kindcheck.Content (exactly one of content and
-- content_base64, the latter valid base64).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_check_content(p jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    c   text := fencegate_payload_string(p, 'content', 'payload.content');
    b64 text := fencegate_payload_string(p, 'content_base64', 'payload.content_base64');
BEGIN
    IF c IS NOT NULL AND b64 IS NOT NULL THEN
        PERFORM fencegate_invalid('payload.content', 'give exactly one of content or content_base64, not both');
    ELSIF c IS NULL AND b64 IS NULL THEN
        PERFORM fencegate_invalid('payload.content', 'one of content or content_base64 is required');
    ELSIF b64 IS NOT NULL AND NOT fencegate_base64_ok(b64) THEN
        PERFORM fencegate_invalid('payload.content_base64', 'is not valid base64 (standard alphabet, padded, no whitespace)');
    END IF;
END
$$;
-- +goose StatementEnd

-- fencegate_blank: strings.TrimSpace(s) == "" (unicode.IsSpace's set).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_blank(s text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN s IS NULL OR s !~ '[^\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]';
END
$$;
-- +goose StatementEnd

-- fencegate_payload_only refuses a field of p that is not one of fields
-- (kindcheck.Only), naming it; what is "an s3" or "a webhook".
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_payload_only(p jsonb, what text, fields text[])
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    k text;
BEGIN
    FOR k IN SELECT jsonb_object_keys(p) ORDER BY 1 LOOP
        IF k <> ALL (fields) THEN
            PERFORM fencegate_invalid('payload.' || k, format('is not a field of %s payload (fields: %s)', what, array_to_string(fields, ', ')));
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- fencegate_payload_string_map reads the field p_name, an object of string
-- values (kindcheck.StringMap): NULL when absent or JSON null.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_payload_string_map(p jsonb, p_name text)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v jsonb := p -> p_name;
    k text;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'object' THEN
        PERFORM fencegate_invalid('payload.' || p_name, 'must be an object of string values');
    END IF;
    FOR k IN SELECT jsonb_object_keys(v) ORDER BY 1 LOOP
        IF jsonb_typeof(v -> k) <> 'string' THEN
            PERFORM fencegate_invalid('payload.' || p_name || '.' || k, 'must be a string');
        END IF;
    END LOOP;
    RETURN v;
END
$$;
-- +goose StatementEnd

-- fencegate_check_url: webhookkind.CheckURL, with fencegate_url_ok's
-- stricter form, for the field p_field.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_check_url(p_field text, s text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF coalesce(s, '') = '' THEN
        PERFORM fencegate_invalid(p_field, 'is required');
    ELSIF octet_length(s) > 2048 THEN
        PERFORM fencegate_invalid(p_field, format('must be at most 2048 bytes, got %s', octet_length(s)));
    ELSIF NOT fencegate_url_ok(s) THEN
        PERFORM fencegate_invalid(p_field, format('%s is not a URL the SQL interface accepts (http or https, a host name, no credentials or fragment)', to_json(s)));
    END IF;
END
$$;
-- +goose StatementEnd

-- fencegate_check_payload checks a payload of a built-in kind with its
-- rules (the Go parsers' order, so the first refusal names the same field),
-- refusing any other kind.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_check_payload(p_kind text, p jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    lists  text[] := ARRAY['to', 'cc', 'bcc'];
    l      text;
    addrs  text[];
    i      int;
    s      text;
    s2     text;
    k      text;
    v      jsonb;
    size   int;
    canon  text;
BEGIN
    IF p IS NULL OR jsonb_typeof(p) <> 'object' THEN
        PERFORM fencegate_invalid('payload', 'must be a JSON object');
    END IF;
    -- The common payloads pass in one expression: PL/pgSQL prepares each
    -- expression it evaluates again in every transaction, and the field
    -- by field checks below are dozens of them (measured: an enqueue
    -- through the interface, each in its own transaction, took about
    -- 0.3 ms more than the Go client's without this). Everything accepted
    -- here the checks below accept too; whatever is not, they judge.
    IF p_kind = 'email'
       AND jsonb_typeof(p -> 'to') = 'string' AND fencegate_email_address_ok(p ->> 'to')
       AND p -> 'cc' IS NULL AND p -> 'bcc' IS NULL
       AND jsonb_typeof(p -> 'from') = 'string' AND fencegate_email_address_ok(p ->> 'from')
       AND jsonb_typeof(p -> 'subject') = 'string' AND NOT fencegate_blank(p ->> 'subject') AND (p ->> 'subject') !~ '[\r\n]'
       AND (p -> 'text' IS NULL OR jsonb_typeof(p -> 'text') = 'string')
       AND (p -> 'html' IS NULL OR jsonb_typeof(p -> 'html') = 'string')
       AND (coalesce(p ->> 'text', '') <> '' OR coalesce(p ->> 'html', '') <> '')
    THEN
        RETURN;
    END IF;
    IF p_kind = 'file'
       AND jsonb_typeof(p -> 'target') = 'string'
       -- segments that start with a letter, a digit, '_' or '-': none
       -- empty, '.', '..' or a dotfile (so none reserved), not absolute
       AND (p ->> 'target') ~ '^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$'
       AND ((jsonb_typeof(p -> 'content') = 'string' AND p -> 'content_base64' IS NULL)
            OR (jsonb_typeof(p -> 'content_base64') = 'string' AND p -> 'content' IS NULL
                AND fencegate_base64_ok(p ->> 'content_base64')))
    THEN
        RETURN;
    END IF;
    CASE p_kind
    WHEN 'email' THEN
        -- emailkind.Parse: the address lists, then from, subject, text,
        -- html as strings, then Validate.
        FOREACH l IN ARRAY lists LOOP
            PERFORM fencegate_payload_strings(p, l, 'an address');
        END LOOP;
        PERFORM fencegate_payload_string(p, 'from', 'payload.from'),
                fencegate_payload_string(p, 'subject', 'payload.subject'),
                fencegate_payload_string(p, 'text', 'payload.text'),
                fencegate_payload_string(p, 'html', 'payload.html');
        IF coalesce(cardinality(fencegate_payload_strings(p, 'to', 'an address')), 0) = 0 THEN
            PERFORM fencegate_invalid('payload.to', 'is required (at least one address)');
        END IF;
        FOREACH l IN ARRAY lists LOOP
            addrs := coalesce(fencegate_payload_strings(p, l, 'an address'), '{}');
            FOR i IN 1 .. coalesce(array_length(addrs, 1), 0) LOOP
                IF NOT fencegate_email_address_ok(addrs[i]) THEN
                    PERFORM fencegate_invalid(format('payload.%s[%s]', l, i - 1),
                        format('%s is not an email address the SQL interface accepts (local@domain, or Name <local@domain>)', to_json(addrs[i])));
                END IF;
            END LOOP;
        END LOOP;
        s := fencegate_payload_string(p, 'from', 'payload.from');
        IF fencegate_blank(s) THEN
            PERFORM fencegate_invalid('payload.from', 'is required');
        END IF;
        IF NOT fencegate_email_address_ok(s) THEN
            PERFORM fencegate_invalid('payload.from', format('%s is not an email address the SQL interface accepts (local@domain, or Name <local@domain>)', to_json(s)));
        END IF;
        s := fencegate_payload_string(p, 'subject', 'payload.subject');
        IF fencegate_blank(s) THEN
            PERFORM fencegate_invalid('payload.subject', 'is required');
        END IF;
        IF s ~ '[\r\n]' THEN
            PERFORM fencegate_invalid('payload.subject', 'must be one line');
        END IF;
        IF coalesce(fencegate_payload_string(p, 'text', 'payload.text'), '') = ''
           AND coalesce(fencegate_payload_string(p, 'html', 'payload.html'), '') = '' THEN
            PERFORM fencegate_invalid('payload.text', 'text or html is required');
        END IF;
    WHEN 'file' THEN
        -- filekind.Parse: target, content, content_base64.
        s := fencegate_payload_string(p, 'target', 'payload.target');
        PERFORM fencegate_payload_string(p, 'content', 'payload.content'),
                fencegate_payload_string(p, 'content_base64', 'payload.content_base64');
        PERFORM fencegate_check_target('payload.target', s);
        PERFORM fencegate_check_content(p);
    WHEN 's3' THEN
        -- s3kind.Parse: only its fields, then bucket, key, content_type,
        -- content, content_base64, metadata, then Validate.
        PERFORM fencegate_payload_only(p, 'an s3', ARRAY['bucket', 'key', 'content', 'content_base64', 'content_type', 'metadata']);
        s := fencegate_payload_string(p, 'bucket', 'payload.bucket');
        s2 := fencegate_payload_string(p, 'key', 'payload.key');
        PERFORM fencegate_payload_string(p, 'content_type', 'payload.content_type'),
                fencegate_payload_string(p, 'content', 'payload.content'),
                fencegate_payload_string(p, 'content_base64', 'payload.content_base64');
        v := fencegate_payload_string_map(p, 'metadata');
        IF coalesce(s, '') <> '' AND (octet_length(s) < 3 OR octet_length(s) > 63 OR s !~ '^[a-z0-9][a-z0-9.-]*[a-z0-9]$') THEN
            PERFORM fencegate_invalid('payload.bucket', format('%s is not a valid bucket name (3-63 of a-z, 0-9, ''.'', ''-'')', to_json(s)));
        END IF;
        PERFORM fencegate_check_target('payload.key', s2);
        IF octet_length(s2) > 1024 THEN
            PERFORM fencegate_invalid('payload.key', format('must be at most 1024 bytes, got %s', octet_length(s2)));
        END IF;
        PERFORM fencegate_check_content(p);
        IF coalesce(fencegate_payload_string(p, 'content_type', 'payload.content_type'), '') ~ '[\r\n]' THEN
            PERFORM fencegate_invalid('payload.content_type', 'must not contain CR, LF or NUL');
        END IF;
        size := 0;
        IF v IS NOT NULL AND jsonb_typeof(v) = 'object' THEN
            FOR k IN SELECT jsonb_object_keys(v) ORDER BY 1 LOOP
                IF k = '' OR k !~ '^[a-z0-9-]+$' THEN
                    PERFORM fencegate_invalid('payload.metadata.' || k, 'must be a lower-case name of letters, digits and ''-''');
                ELSIF left(k, 10) = 'fencegate-' THEN
                    PERFORM fencegate_invalid('payload.metadata.' || k, 'is the adapter''s own (fencegate-*) and cannot be set');
                ELSIF (v ->> k) ~ '[\r\n]' THEN
                    PERFORM fencegate_invalid('payload.metadata.' || k, 'must not contain CR, LF or NUL');
                END IF;
                size := size + octet_length(k) + octet_length(v ->> k);
            END LOOP;
        END IF;
        IF size > 1024 THEN
            PERFORM fencegate_invalid('payload.metadata', format('is %s bytes, over the limit of 1024', size));
        END IF;
    WHEN 'webhook' THEN
        -- webhookkind.Parse: only its fields, then url, method,
        -- content_type, lookup_url, body_base64, headers, then Validate.
        PERFORM fencegate_payload_only(p, 'a webhook', ARRAY['url', 'method', 'headers', 'body', 'body_base64', 'content_type', 'lookup_url']);
        PERFORM fencegate_payload_string(p, 'url', 'payload.url'),
                fencegate_payload_string(p, 'method', 'payload.method'),
                fencegate_payload_string(p, 'content_type', 'payload.content_type'),
                fencegate_payload_string(p, 'lookup_url', 'payload.lookup_url'),
                fencegate_payload_string(p, 'body_base64', 'payload.body_base64');
        v := fencegate_payload_string_map(p, 'headers');
        PERFORM fencegate_check_url('payload.url', fencegate_payload_string(p, 'url', 'payload.url'));
        s := fencegate_payload_string(p, 'method', 'payload.method');
        IF coalesce(s, '') <> '' AND s <> ALL (ARRAY['POST', 'PUT', 'PATCH', 'DELETE']) THEN
            PERFORM fencegate_invalid('payload.method', format('must be one of POST, PUT, PATCH, DELETE, got %s', to_json(s)));
        END IF;
        IF v IS NOT NULL AND jsonb_typeof(v) = 'object' THEN
            FOR k IN SELECT jsonb_object_keys(v) ORDER BY 1 LOOP
                canon := lower(k);
                IF k !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' THEN
                    PERFORM fencegate_invalid('payload.headers.' || k, 'is not a valid header name');
                ELSIF canon = ANY (ARRAY['idempotency-key', 'fencegate-resource', 'fencegate-epoch', 'fencegate-intent-id',
                                         'webhook-id', 'webhook-timestamp', 'webhook-signature']) THEN
                    PERFORM fencegate_invalid('payload.headers.' || k, 'is set by the gateway and cannot be overridden');
                ELSIF canon = 'content-type' THEN
                    PERFORM fencegate_invalid('payload.headers.' || k, 'is set from the body; give content_type with body_base64');
                ELSIF canon = ANY (ARRAY['host', 'content-length', 'transfer-encoding', 'connection', 'keep-alive',
                                         'proxy-connection', 'te', 'trailer', 'upgrade', 'expect']) THEN
                    PERFORM fencegate_invalid('payload.headers.' || k, 'is a connection or framing header and cannot be set');
                ELSIF (v ->> k) ~ '[\r\n]' THEN
                    PERFORM fencegate_invalid('payload.headers.' || k, 'must not contain CR, LF or NUL');
                END IF;
            END LOOP;
        END IF;
        s := fencegate_payload_string(p, 'body_base64', 'payload.body_base64');
        s2 := fencegate_payload_string(p, 'content_type', 'payload.content_type');
        IF p ? 'body' AND s IS NOT NULL THEN
            PERFORM fencegate_invalid('payload.body', 'give at most one of body or body_base64, not both');
        ELSIF s IS NOT NULL THEN
            IF NOT fencegate_base64_ok(s) THEN
                PERFORM fencegate_invalid('payload.body_base64', 'is not valid base64 (standard alphabet, padded, no whitespace)');
            END IF;
            IF coalesce(s2, '') = '' THEN
                PERFORM fencegate_invalid('payload.content_type', 'is required with body_base64');
            END IF;
            IF s2 ~ '[\r\n]' THEN
                PERFORM fencegate_invalid('payload.content_type', 'must not contain CR, LF or NUL');
            END IF;
        ELSIF coalesce(s2, '') <> '' THEN
            PERFORM fencegate_invalid('payload.content_type', 'applies only to body_base64 (a JSON body is sent as application/json)');
        END IF;
        s := fencegate_payload_string(p, 'lookup_url', 'payload.lookup_url');
        IF coalesce(s, '') <> '' THEN
            PERFORM fencegate_check_url('payload.lookup_url', s);
        END IF;
    ELSE
        PERFORM fencegate_invalid('kind', format('kind %s is not accepted by the SQL interface (it accepts email, file, s3, webhook); '
            'enqueue a program''s own kinds with its Go client or the HTTP intake', to_json(p_kind)));
    END CASE;
END
$$;
-- +goose StatementEnd

-- enqueue: the fenced enqueue, in the caller's transaction, so that the
-- caller's own writes and the intent commit or roll back together. See
-- docs/sql.md. Outcomes: 'created' (a new intent) or 'duplicate' (the
-- operation id was committed before with the same content: a retry after
-- a lost response; the same intent, whatever the epoch is now). Refusals
-- raise ZF002 (stale epoch), ZF003 (conflict) or ZF004 (invalid input).
-- The resource's control row stays locked until the caller's transaction
-- ends: keep it short (every grant of the resource waits for it).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION enqueue(
    resource text, epoch bigint, operation_id text, kind text, payload jsonb,
    key text DEFAULT NULL, fence text DEFAULT NULL,
    OUT outcome text, OUT intent_id bigint, OUT status text, OUT current_epoch bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
    l_fence text;
    l_key   text;
    r       record;
BEGIN
    -- The checks of outbox.normalize. The common case passes in one
    -- expression (see fencegate_check_payload for why that matters);
    -- otherwise each check in outbox.normalize's order, a refusal raising,
    -- so nothing is stored.
    -- (coalesce: a NULL argument makes the expression NULL, which must
    -- send the call to the checks, not past them.)
    IF NOT coalesce(octet_length(enqueue.resource) BETWEEN 1 AND 200
            AND enqueue.epoch BETWEEN 1 AND 9007199254740992
            AND octet_length(enqueue.operation_id) BETWEEN 1 AND 200
            AND enqueue.kind IN ('email', 'file', 'webhook', 's3')
            AND coalesce(enqueue.fence, '') IN ('', 'commit', 'execute')
            AND CASE WHEN coalesce(enqueue.key, '') = ''
                     THEN octet_length(enqueue.resource) + 1 + octet_length(enqueue.operation_id) <= 255
                     ELSE octet_length(enqueue.key) <= 255 END
            AND enqueue.payload IS NOT NULL
            AND octet_length(enqueue.payload::text) <= 262144, false)
    THEN
        PERFORM fencegate_check_id('resource', enqueue.resource, 200);
        IF enqueue.epoch IS NULL OR enqueue.epoch < 1 THEN
            PERFORM fencegate_invalid('epoch', format('must be at least 1, got %s', coalesce(enqueue.epoch::text, 'null')));
        ELSIF enqueue.epoch > 9007199254740992 THEN
            PERFORM fencegate_invalid('epoch', format('must be at most 9007199254740992 (2^53), got %s', enqueue.epoch));
        END IF;
        PERFORM fencegate_check_id('operation_id', enqueue.operation_id, 200);
        IF coalesce(enqueue.kind, '') = '' THEN
            PERFORM fencegate_invalid('kind', 'must not be empty');
        END IF;
        IF enqueue.kind NOT IN ('email', 'file', 'webhook', 's3') THEN
            PERFORM fencegate_check_payload(enqueue.kind, '{}'); -- raises: not a kind of the SQL interface
        END IF;
        IF coalesce(enqueue.fence, '') NOT IN ('', 'commit', 'execute') THEN
            PERFORM fencegate_invalid('fence', format('must be "commit" or "execute", got %s', to_json(enqueue.fence)));
        END IF;
        IF coalesce(enqueue.key, '') = '' THEN
            IF octet_length(enqueue.resource || '/' || enqueue.operation_id) > 255 THEN
                PERFORM fencegate_invalid('idempotency_key', format('the default key "<resource>/<operation_id>" is %s bytes, over the limit of 255; pass a shorter key',
                    octet_length(enqueue.resource || '/' || enqueue.operation_id)));
            END IF;
        ELSE
            PERFORM fencegate_check_id('idempotency_key', enqueue.key, 255);
        END IF;
        IF enqueue.payload IS NULL THEN
            PERFORM fencegate_invalid('payload', 'is required (a JSON object)');
        ELSIF octet_length(enqueue.payload::text) > 262144 THEN
            PERFORM fencegate_invalid('payload', format('is %s bytes, over the limit of 262144', octet_length(enqueue.payload::text)));
        END IF;
    END IF;
    -- The defaults of outbox.normalize: the kind's fence (email and
    -- webhook commit, file and s3 execute), the key <resource>/<operation_id>.
    l_fence := coalesce(nullif(enqueue.fence, ''),
        CASE WHEN enqueue.kind IN ('email', 'webhook') THEN 'commit' ELSE 'execute' END);
    l_key := coalesce(nullif(enqueue.key, ''), enqueue.resource || '/' || enqueue.operation_id);
    PERFORM fencegate_check_payload(enqueue.kind, enqueue.payload);

    -- Durable when the caller's COMMIT returns, whatever the server's
    -- synchronous_commit (internal/durable): lasts until the caller's
    -- transaction ends.
    PERFORM set_config('synchronous_commit', 'on', true)
    WHERE current_setting('synchronous_commit') IN ('off', 'local');

    -- The fence, the dedup and the insert: fencegate_enqueue, the same
    -- function the Go client calls, under the resource's control-row lock.
    SELECT * INTO r FROM fencegate_enqueue(enqueue.resource, enqueue.epoch, enqueue.operation_id, enqueue.kind,
        l_key, l_fence, enqueue.payload, true);
    current_epoch := r.current_epoch;
    CASE r.outcome
    WHEN 'inserted' THEN
        outcome := 'created';
        intent_id := r.intent_id;
        status := r.status;
    WHEN 'duplicate' THEN
        outcome := 'duplicate';
        intent_id := r.intent_id;
        status := r.status;
    WHEN 'stale' THEN
        PERFORM fencegate_raise('ZF002',
            format('stale epoch: resource %s is at epoch %s, not %s: authority moved on; nothing of this transaction may commit',
                to_json(enqueue.resource), r.current_epoch, enqueue.epoch),
            NULL, jsonb_build_object('code', 'stale_epoch', 'resource', enqueue.resource,
                'supplied_epoch', enqueue.epoch, 'current_epoch', r.current_epoch));
    ELSE
        PERFORM fencegate_raise('ZF003',
            format('conflict: operation id %s of resource %s was used for intent %s with different content',
                to_json(enqueue.operation_id), to_json(enqueue.resource), r.intent_id),
            NULL, jsonb_build_object('code', 'conflict', 'resource', enqueue.resource,
                'operation_id', enqueue.operation_id, 'intent_id', r.intent_id));
    END CASE;
END
$$;
-- +goose StatementEnd

-- fencegate_check_lease_args: lease's checks of resource, holder and ttl.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_check_lease_args(p_resource text, p_holder text, p_epoch bigint, p_ttl interval, p_check_epoch boolean, p_check_ttl boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM fencegate_check_id('resource', p_resource, 200);
    PERFORM fencegate_check_id('holder', p_holder, 200);
    IF p_check_epoch THEN
        IF p_epoch IS NULL OR p_epoch < 1 THEN
            PERFORM fencegate_invalid('epoch', format('must be at least 1, got %s', coalesce(p_epoch::text, 'null')));
        ELSIF p_epoch > 9007199254740992 THEN
            PERFORM fencegate_invalid('epoch', format('must be at most 9007199254740992 (2^53), got %s', p_epoch));
        END IF;
    END IF;
    IF p_check_ttl AND (p_ttl IS NULL OR p_ttl < interval '10 milliseconds' OR p_ttl > interval '24 hours') THEN
        PERFORM fencegate_invalid('ttl', format('must be between 10ms and 24h, got %s', coalesce(p_ttl::text, 'null')));
    END IF;
END
$$;
-- +goose StatementEnd

-- fencegate_stale_lease raises ZF002 for a renew or release that matched
-- nothing, explaining why (lease.Issuer.staleError).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_stale_lease(p_resource text, p_holder text, p_epoch bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    c      record;
    reason text;
BEGIN
    SELECT r.epoch, r.holder INTO c FROM resources r WHERE r.resource_id = p_resource;
    IF NOT FOUND THEN
        reason := 'no epoch was ever issued for this resource';
        c := ROW(0::bigint, NULL::text);
    ELSIF c.epoch = p_epoch AND c.holder IS NULL THEN
        reason := 'the lease was released';
    ELSIF c.epoch = p_epoch AND c.holder <> p_holder THEN
        reason := format('the lease is held by %s', to_json(c.holder));
    END IF;
    PERFORM fencegate_raise('ZF002',
        format('stale epoch: resource %s is at epoch %s, not %s%s', to_json(p_resource), coalesce(c.epoch, 0), p_epoch,
            coalesce(': ' || reason, '')),
        NULL, jsonb_build_object('code', 'stale_epoch', 'resource', p_resource, 'supplied_epoch', p_epoch,
            'current_epoch', coalesce(c.epoch, 0), 'reason', reason));
END
$$;
-- +goose StatementEnd

-- acquire: lease.Issuer.Acquire. Grants holder a lease of ttl on resource
-- with a new, higher epoch (also for the holder that holds it already),
-- recorded in the grant history; a live lease of another holder raises
-- ZF005 (DETAIL: holder, current_epoch, expires_at). Commit before using
-- the epoch: a grant rolled back was never made. It waits at most 5 s for
-- the resource's control row (lock_timeout, SQLSTATE 55P03: busy, nothing
-- granted), and checks the epoch authority as every grant does (ZF001
-- after a failover that cannot be trusted; failover_epoch_jump as
-- --failover-epoch-jump: use the gateway's).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION acquire(
    resource text, holder text, ttl interval, failover_epoch_jump bigint DEFAULT 1000000,
    OUT epoch bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
SET lock_timeout = '5s'
AS $$
#variable_conflict use_variable
DECLARE
    c      record;
    l_how  text;
    l_prev text;
    l_pw   text;
BEGIN
    PERFORM fencegate_check_lease_args(acquire.resource, acquire.holder, NULL, acquire.ttl, false, true);
    IF acquire.failover_epoch_jump IS NULL OR acquire.failover_epoch_jump < 0 OR acquire.failover_epoch_jump > 9007199254740992 THEN
        PERFORM fencegate_invalid('failover_epoch_jump', format('must be between 0 and 9007199254740992 (2^53), got %s', coalesce(acquire.failover_epoch_jump::text, 'null')));
    END IF;
    PERFORM set_config('synchronous_commit', 'on', true)
    WHERE current_setting('synchronous_commit') IN ('off', 'local');

    -- The authority check and the control row, then its lock (lease.lockResource).
    INSERT INTO resources AS r (resource_id, epoch) SELECT acquire.resource, fencegate_epoch_authority(acquire.failover_epoch_jump)
    ON CONFLICT (resource_id) DO NOTHING;
    SELECT r.epoch, r.holder, r.lease_expires_at, coalesce(r.lease_expires_at > now(), false) AS live,
           now() - r.renewed_at AS since
    INTO c FROM resources r WHERE r.resource_id = acquire.resource FOR UPDATE;

    IF c.live AND c.holder IS NOT NULL AND c.holder <> acquire.holder THEN
        PERFORM fencegate_raise('ZF005',
            format('lease on %s held by %s (epoch %s) until %s', to_json(acquire.resource), to_json(c.holder), c.epoch, c.lease_expires_at),
            NULL, jsonb_build_object('code', 'lease_held', 'resource', acquire.resource, 'holder', c.holder,
                'current_epoch', c.epoch, 'expires_at', c.lease_expires_at));
    END IF;
    IF c.epoch >= 9007199254740992 THEN
        PERFORM fencegate_invalid('epoch', format('the resource''s epochs are exhausted: %s is at epoch %s, the ceiling (2^53); use a new resource id',
            to_json(acquire.resource), c.epoch));
    END IF;

    -- Every grant is a new epoch, the same holder's too (see lease.Acquire).
    epoch := c.epoch + 1;
    UPDATE resources r
    SET epoch = acquire.epoch, holder = acquire.holder, lease_expires_at = now() + acquire.ttl,
        renewed_at = now(), updated_at = now()
    WHERE r.resource_id = acquire.resource
    RETURNING r.lease_expires_at INTO expires_at;

    -- How authority passed (lease.acquireGrant).
    IF c.live AND c.holder = acquire.holder THEN
        l_how := 'reacquired'; l_prev := c.holder;
    ELSIF c.holder IS NOT NULL THEN
        l_how := 'after_expiry'; l_prev := c.holder;
    ELSIF c.epoch = 0 THEN
        l_how := 'free'; c.since := NULL;
    ELSE
        SELECT g.how, g.holder INTO l_pw, l_prev FROM epoch_grants g
        WHERE g.resource_id = acquire.resource AND g.epoch = c.epoch;
        IF NOT FOUND THEN
            l_how := CASE WHEN c.since IS NULL THEN 'free' ELSE 'released' END;
            l_prev := NULL;
        ELSIF l_pw IN ('external_advance', 'failover') THEN
            l_how := 'free'; l_prev := NULL; c.since := NULL;
        ELSE
            l_how := 'released';
        END IF;
    END IF;
    INSERT INTO epoch_grants (resource_id, epoch, holder, how, previous_epoch, previous_holder, since_previous_renewal, principal)
    VALUES (acquire.resource, acquire.epoch, acquire.holder, l_how, c.epoch, l_prev, c.since,
            nullif(current_setting('fencegate.principal', true), ''));
END
$$;
-- +goose StatementEnd

-- renew: lease.Issuer.Renew. Extends holder's lease by ttl from now, only
-- while epoch is the current one and held by holder (also after it
-- expired, while nobody took over); else ZF002. Keeps the epoch.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION renew(resource text, holder text, epoch bigint, ttl interval, OUT expires_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
SET lock_timeout = '5s'
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM fencegate_check_lease_args(renew.resource, renew.holder, renew.epoch, renew.ttl, true, true);
    PERFORM set_config('synchronous_commit', 'on', true)
    WHERE current_setting('synchronous_commit') IN ('off', 'local');
    -- One conditional update: the check and the extension are one step.
    UPDATE resources r
    SET lease_expires_at = now() + renew.ttl, renewed_at = now(), updated_at = now()
    WHERE r.resource_id = renew.resource AND r.epoch = renew.epoch AND r.holder = renew.holder
    RETURNING r.lease_expires_at INTO expires_at;
    IF NOT FOUND THEN
        PERFORM fencegate_stale_lease(renew.resource, renew.holder, renew.epoch);
    END IF;
END
$$;
-- +goose StatementEnd

-- release: lease.Issuer.Release. Frees holder's lease; the epoch stays, so
-- the next acquire gets epoch + 1. Releasing an already released lease of
-- the current epoch succeeds; else ZF002.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION release(resource text, holder text, epoch bigint)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
SET lock_timeout = '5s'
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM fencegate_check_lease_args(release.resource, release.holder, release.epoch, NULL, true, false);
    PERFORM set_config('synchronous_commit', 'on', true)
    WHERE current_setting('synchronous_commit') IN ('off', 'local');
    UPDATE resources r
    SET holder = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE r.resource_id = release.resource AND r.epoch = release.epoch
      AND (r.holder = release.holder OR r.holder IS NULL);
    IF NOT FOUND THEN
        PERFORM fencegate_stale_lease(release.resource, release.holder, release.epoch);
    END IF;
END
$$;
-- +goose StatementEnd

-- Least authority: the interface runs with its owner's rights, so nobody
-- may call it but the roles granted to (docs/sql.md):
--   GRANT USAGE ON SCHEMA fencegate TO worker;
--   GRANT EXECUTE ON FUNCTION fencegate.enqueue(text, bigint, text, text, jsonb, text, text) TO worker;
-- (and acquire, renew, release for a worker that takes its leases here).
REVOKE EXECUTE ON FUNCTION enqueue(text, bigint, text, text, jsonb, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION acquire(text, text, interval, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION renew(text, text, bigint, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION release(text, text, bigint) FROM PUBLIC;

-- +goose Down
DROP FUNCTION IF EXISTS release(text, text, bigint);
DROP FUNCTION IF EXISTS renew(text, text, bigint, interval);
DROP FUNCTION IF EXISTS acquire(text, text, interval, bigint);
DROP FUNCTION IF EXISTS fencegate_stale_lease(text, text, bigint);
DROP FUNCTION IF EXISTS fencegate_check_lease_args(text, text, bigint, interval, boolean, boolean);
DROP FUNCTION IF EXISTS enqueue(text, bigint, text, text, jsonb, text, text);
DROP FUNCTION IF EXISTS fencegate_check_payload(text, jsonb);
DROP FUNCTION IF EXISTS fencegate_check_url(text, text);
DROP FUNCTION IF EXISTS fencegate_payload_string_map(jsonb, text);
DROP FUNCTION IF EXISTS fencegate_payload_only(jsonb, text, text[]);
DROP FUNCTION IF EXISTS fencegate_blank(text);
DROP FUNCTION IF EXISTS fencegate_check_content(jsonb);
DROP FUNCTION IF EXISTS fencegate_check_target(text, text);
DROP FUNCTION IF EXISTS fencegate_base64_ok(text);
DROP FUNCTION IF EXISTS fencegate_url_ok(text);
DROP FUNCTION IF EXISTS fencegate_email_address_ok(text);
DROP FUNCTION IF EXISTS fencegate_payload_strings(jsonb, text, text);
DROP FUNCTION IF EXISTS fencegate_payload_string(jsonb, text, text);
DROP FUNCTION IF EXISTS fencegate_check_id(text, text, int);
DROP FUNCTION IF EXISTS fencegate_invalid(text, text);
DROP FUNCTION IF EXISTS fencegate_raise(text, text, text, jsonb);
DROP FUNCTION IF EXISTS interface_version();
