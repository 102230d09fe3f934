-- The SQL interface, version 1 (docs/sql.md): enqueue, acquire, renew,
-- release, for workers in any language. Their signatures change only with a
-- major version of fencegate (interface_version). They refuse with
-- SQLSTATEs of class ZF (ZF001 is the epoch authority's, epoch.sql):
--   ZF002 stale_epoch   the epoch is not the resource's current one
--   ZF003 conflict      the operation id was used with other content
--   ZF004 invalid_input a field is missing or invalid (the error's COLUMN
--                       names it: "payload.to[1]")
--   ZF005 lease_held    another holder's lease is live
-- with the details as JSON in the error's DETAIL. They run with their
-- owner's rights (SECURITY DEFINER, their search_path pinned) and are
-- callable only by roles granted EXECUTE (and USAGE on the schema): a
-- worker's role needs nothing on the tables, so it can enqueue and hold
-- leases but never write an intent's status by hand. A raised error aborts
-- the caller's transaction: nothing of it is stored, the caller's own
-- writes included. The payloads of the built-in kinds are checked with
-- fencegate_check_payload (payload.sql); other kinds are refused.

-- interface_version: the SQL interface's major version. A worker can check
-- it at start (SELECT fencegate.interface_version() = 1): the signatures
-- and SQLSTATEs below change only when it changes.
CREATE OR REPLACE FUNCTION fencegate.interface_version() RETURNS int
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 1 $$;

-- fencegate_raise raises an error of the interface: SQLSTATE code, the
-- message, the field named as the error's COLUMN (invalid input), and a
-- DETAIL of JSON for programs.
CREATE OR REPLACE FUNCTION fencegate.fencegate_raise(p_code text, p_message text, p_field text DEFAULT NULL, p_detail jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_field IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message, DETAIL = coalesce(p_detail::text, '{}');
    END IF;
    RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message, COLUMN = p_field, DETAIL = coalesce(p_detail::text, '{}');
END
$$;

-- fencegate_invalid raises ZF004 naming field: "<field>: <message>".
CREATE OR REPLACE FUNCTION fencegate.fencegate_invalid(p_field text, p_message text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM fencegate.fencegate_raise('ZF004', p_field || ': ' || p_message, p_field,
        jsonb_build_object('code', 'invalid_input', 'field', p_field));
END
$$;

-- fencegate_check_id checks an identifier as outbox and lease do (not
-- empty, at most p_max bytes, no control or format character; text can
-- hold neither NUL nor invalid UTF-8). The characters are
-- kindcheck.Invisible's, Unicode's categories Cc and Cf (as of Unicode 17,
-- Go's tables): fencegate_check_target lists them too, and a test compares
-- both lists with Go's character by character.
CREATE OR REPLACE FUNCTION fencegate.fencegate_check_id(p_field text, p_value text, p_max int)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad text := substring(p_value FROM '[\u0001-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]');
BEGIN
    IF p_value IS NULL OR p_value = '' THEN
        PERFORM fencegate.fencegate_invalid(p_field, 'must not be empty');
    ELSIF octet_length(p_value) > p_max THEN
        PERFORM fencegate.fencegate_invalid(p_field, format('must be at most %s bytes, got %s', p_max, octet_length(p_value)));
    ELSIF bad IS NOT NULL THEN
        PERFORM fencegate.fencegate_invalid(p_field, format('must not contain control or format characters, got U+%s',
            upper(lpad(to_hex(ascii(bad)), greatest(4, length(to_hex(ascii(bad)))), '0'))));
    END IF;
END
$$;

-- enqueue: the fenced enqueue, in the caller's transaction, so that the
-- caller's own writes and the intent commit or roll back together. See
-- docs/sql.md. Outcomes: 'created' (a new intent) or 'duplicate' (the
-- operation id was committed before with the same content: a retry after
-- a lost response; the same intent, whatever the epoch is now). Refusals
-- raise ZF002 (stale epoch), ZF003 (conflict) or ZF004 (invalid input).
-- The resource's control row stays locked until the caller's transaction
-- ends: keep it short (every grant of the resource waits for it).
CREATE OR REPLACE FUNCTION fencegate.enqueue(
    resource text, epoch bigint, operation_id text, kind text, payload jsonb,
    key text DEFAULT NULL, fence text DEFAULT NULL,
    OUT outcome text, OUT intent_id bigint, OUT status text, OUT current_epoch bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    l_fence text;
    l_key   text;
    r       record;
    a       record;
    l_declared text;
    l_tc    text;
    l_tcj   jsonb;
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
            -- ids of printable ASCII have no control or format character;
            -- others go to fencegate_check_id below, which looks.
            AND (enqueue.resource || enqueue.operation_id || coalesce(enqueue.key, '')) !~ '[^ -~]'
            AND enqueue.kind IN ('email', 'file', 'webhook', 's3')
            AND coalesce(enqueue.fence, '') IN ('', 'commit', 'execute')
            AND CASE WHEN coalesce(enqueue.key, '') = ''
                     THEN octet_length(enqueue.resource) + 1 + octet_length(enqueue.operation_id) <= 255
                     ELSE octet_length(enqueue.key) <= 255 END
            AND enqueue.payload IS NOT NULL
            AND octet_length(enqueue.payload::text) <= 262144, false)
    THEN
        PERFORM fencegate.fencegate_check_id('resource', enqueue.resource, 200);
        IF enqueue.epoch IS NULL OR enqueue.epoch < 1 THEN
            PERFORM fencegate.fencegate_invalid('epoch', format('must be at least 1, got %s', coalesce(enqueue.epoch::text, 'null')));
        ELSIF enqueue.epoch > 9007199254740992 THEN
            PERFORM fencegate.fencegate_invalid('epoch', format('must be at most 9007199254740992 (2^53), got %s', enqueue.epoch));
        END IF;
        PERFORM fencegate.fencegate_check_id('operation_id', enqueue.operation_id, 200);
        IF coalesce(enqueue.kind, '') = '' THEN
            PERFORM fencegate.fencegate_invalid('kind', 'must not be empty');
        END IF;
        IF enqueue.kind NOT IN ('email', 'file', 'webhook', 's3') THEN
            PERFORM fencegate.fencegate_check_payload(enqueue.kind, '{}'::jsonb); -- raises: not a kind of the SQL interface
        END IF;
        IF coalesce(enqueue.fence, '') NOT IN ('', 'commit', 'execute') THEN
            PERFORM fencegate.fencegate_invalid('fence', format('must be "commit" or "execute", got %s', to_json(enqueue.fence)));
        END IF;
        IF coalesce(enqueue.key, '') = '' THEN
            IF octet_length(enqueue.resource || '/' || enqueue.operation_id) > 255 THEN
                PERFORM fencegate.fencegate_invalid('idempotency_key', format('the default key "<resource>/<operation_id>" is %s bytes, over the limit of 255; pass a shorter key',
                    octet_length(enqueue.resource || '/' || enqueue.operation_id)));
            END IF;
        ELSE
            PERFORM fencegate.fencegate_check_id('idempotency_key', enqueue.key, 255);
        END IF;
        IF enqueue.payload IS NULL THEN
            PERFORM fencegate.fencegate_invalid('payload', 'is required (a JSON object)');
        ELSIF octet_length(enqueue.payload::text) > 262144 THEN
            PERFORM fencegate.fencegate_invalid('payload', format('is %s bytes, over the limit of 262144', octet_length(enqueue.payload::text)));
        END IF;
    END IF;
    -- The defaults of outbox.normalize: the kind's fence (email and
    -- webhook commit, file and s3 execute), the key <resource>/<operation_id>.
    l_fence := coalesce(nullif(enqueue.fence, ''),
        CASE WHEN enqueue.kind IN ('email', 'webhook') THEN 'commit' ELSE 'execute' END);
    l_key := coalesce(nullif(enqueue.key, ''), enqueue.resource || '/' || enqueue.operation_id);
    -- The rule set (policy.sql), before the payload is looked at and the
    -- control row locked: a principal outside its scope learns nothing of
    -- the resource and holds nothing of it.
    SELECT * INTO a FROM fencegate.fencegate_authorize(enqueue.resource, enqueue.kind);
    -- The principal's key scope is applied by fencegate_enqueue
    -- (fencegate_rules), as for every way in; under the global scope a key
    -- of the scoped form is refused here, as outbox.normalize does.
    IF a.key_scope IS DISTINCT FROM 'resource' AND fencegate.fencegate_scoped_shape(enqueue.key) THEN
        PERFORM fencegate.fencegate_invalid('idempotency_key', format('%s has the form of a resource-scoped key ("<bytes>:<resource>/<key>"), which only that resource''s scoped enqueues make',
            to_json(enqueue.key)));
    END IF;
    PERFORM fencegate.fencegate_check_payload(enqueue.kind, enqueue.payload);
    -- The trace context the caller's transaction may set for the intent
    -- (fencegate.trace_context, the setting the Go client sets; the
    -- column's default reads it): a W3C carrier, a JSON object of strings,
    -- small. Checked here, not stored as given: the relay reads it again
    -- for every intent, and a bad one would fail the insert as 22P02.
    l_tc := nullif(current_setting('fencegate.trace_context', true), '');
    IF l_tc IS NOT NULL THEN
        BEGIN
            l_tcj := l_tc::jsonb; -- the block's only statement: its errors are the cast's
        EXCEPTION WHEN OTHERS THEN
            l_tcj := NULL;
        END;
        IF octet_length(l_tc) > 4096 OR l_tcj IS NULL OR jsonb_typeof(l_tcj) <> 'object'
           OR EXISTS (SELECT 1 FROM jsonb_each(l_tcj) e WHERE jsonb_typeof(e.value) <> 'string') THEN
            PERFORM fencegate.fencegate_invalid('trace_context', format('must be a W3C trace context, a JSON object of strings ({"traceparent": "00-…"}) of at most 4096 bytes, got %s bytes%s',
                octet_length(l_tc), CASE WHEN l_tcj IS NULL THEN ' that are not JSON' ELSE ' of JSON ' || jsonb_typeof(l_tcj) END));
        END IF;
    END IF;

    -- Durable when the caller's COMMIT returns, whatever the server's
    -- synchronous_commit (internal/durable): lasts until the caller's
    -- transaction ends.
    PERFORM set_config('synchronous_commit', 'on', true)
    WHERE current_setting('synchronous_commit') IN ('off', 'local');

    -- The fence, the dedup and the insert: fencegate_enqueue, the same
    -- function the Go client calls, under the resource's control-row lock.
    -- Under a rule set the intent records the mapped principal (the
    -- column's default reads fencegate.principal), never one the caller
    -- declared; the caller's setting is put back after.
    IF a.principal IS NOT NULL THEN
        l_declared := current_setting('fencegate.principal', true);
        PERFORM set_config('fencegate.principal', a.principal, true);
    END IF;
    SELECT * INTO r FROM fencegate.fencegate_enqueue(enqueue.resource, enqueue.epoch, enqueue.operation_id, enqueue.kind,
        l_key, l_fence, enqueue.payload, true);
    IF a.principal IS NOT NULL THEN
        PERFORM set_config('fencegate.principal', coalesce(l_declared, ''), true);
    END IF;
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
        -- Counted before the raise rolls the caller's transaction back
        -- (a sequence: the count stays).
        PERFORM fencegate.fencegate_count('sql_stale_epoch');
        PERFORM fencegate.fencegate_raise('ZF002',
            format('stale epoch: resource %s is at epoch %s, not %s: authority moved on; nothing of this transaction may commit',
                to_json(enqueue.resource), r.current_epoch, enqueue.epoch),
            NULL, jsonb_build_object('code', 'stale_epoch', 'resource', enqueue.resource,
                'supplied_epoch', enqueue.epoch, 'current_epoch', r.current_epoch));
    ELSE
        PERFORM fencegate.fencegate_raise('ZF003',
            format('conflict: operation id %s of resource %s was used for intent %s with different content',
                to_json(enqueue.operation_id), to_json(enqueue.resource), r.intent_id),
            NULL, jsonb_build_object('code', 'conflict', 'resource', enqueue.resource,
                'operation_id', enqueue.operation_id, 'intent_id', r.intent_id));
    END CASE;
END
$$;

-- fencegate_check_lease_args: lease's checks of resource, holder and ttl.
CREATE OR REPLACE FUNCTION fencegate.fencegate_check_lease_args(p_resource text, p_holder text, p_epoch bigint, p_ttl interval, p_check_epoch boolean, p_check_ttl boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM fencegate.fencegate_check_id('resource', p_resource, 200);
    PERFORM fencegate.fencegate_check_id('holder', p_holder, 200);
    IF p_check_epoch THEN
        IF p_epoch IS NULL OR p_epoch < 1 THEN
            PERFORM fencegate.fencegate_invalid('epoch', format('must be at least 1, got %s', coalesce(p_epoch::text, 'null')));
        ELSIF p_epoch > 9007199254740992 THEN
            PERFORM fencegate.fencegate_invalid('epoch', format('must be at most 9007199254740992 (2^53), got %s', p_epoch));
        END IF;
    END IF;
    -- Months first: they have no fixed length. The bound below compares as
    -- PostgreSQL does, a month as 30 days, while now() + ttl adds calendar
    -- months: "1000 mon -30000 days 1 hour" is 1 h to the comparison and
    -- over a year to the expiry.
    IF p_check_ttl AND (extract(year FROM p_ttl) <> 0 OR extract(month FROM p_ttl) <> 0) THEN
        PERFORM fencegate.fencegate_invalid('ttl', format('must not count months or years (they have no fixed length): give days, hours, minutes or seconds, got %s', p_ttl));
    END IF;
    IF p_check_ttl AND (p_ttl IS NULL OR p_ttl < interval '10 milliseconds' OR p_ttl > interval '24 hours') THEN
        PERFORM fencegate.fencegate_invalid('ttl', format('must be between 10ms and 24h, got %s', coalesce(p_ttl::text, 'null')));
    END IF;
END
$$;

-- fencegate_stale_lease raises ZF002 for a renew or release that matched
-- nothing, explaining why (lease.Issuer.staleError).
CREATE OR REPLACE FUNCTION fencegate.fencegate_stale_lease(p_resource text, p_holder text, p_epoch bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c      record;
    reason text;
BEGIN
    SELECT r.epoch, r.holder INTO c FROM fencegate.resources r WHERE r.resource_id = p_resource;
    IF NOT FOUND THEN
        reason := 'no epoch was ever issued for this resource';
        SELECT 0::bigint AS epoch, NULL::text AS holder INTO c;
    ELSIF c.epoch = p_epoch AND c.holder IS NULL THEN
        reason := 'the lease was released';
    ELSIF c.epoch = p_epoch AND c.holder <> p_holder THEN
        reason := format('the lease is held by %s', to_json(c.holder));
    END IF;
    -- Only the SQL interface's renew and release call this.
    PERFORM fencegate.fencegate_count('sql_stale_epoch');
    PERFORM fencegate.fencegate_raise('ZF002',
        format('stale epoch: resource %s is at epoch %s, not %s%s', to_json(p_resource), coalesce(c.epoch, 0), p_epoch,
            coalesce(': ' || reason, '')),
        NULL, jsonb_build_object('code', 'stale_epoch', 'resource', p_resource, 'supplied_epoch', p_epoch,
            'current_epoch', coalesce(c.epoch, 0), 'reason', reason));
END
$$;

-- acquire: lease.Issuer.Acquire. Grants holder a lease of ttl on resource
-- with a new, higher epoch (also for the holder that holds it already),
-- recorded in the grant history; a live lease of another holder raises
-- ZF005 (DETAIL: holder, current_epoch, expires_at). Commit before using
-- the epoch: a grant rolled back was never made. It waits at most 5 s for
-- the resource's control row (lock_timeout, SQLSTATE 55P03: busy, nothing
-- granted), and checks the epoch authority as every grant does (ZF001
-- after a failover that cannot be trusted; failover_epoch_jump as
-- --failover-epoch-jump: use the gateway's).
CREATE OR REPLACE FUNCTION fencegate.acquire(
    resource text, holder text, ttl interval, failover_epoch_jump bigint DEFAULT 1000000,
    OUT epoch bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
#variable_conflict use_variable
DECLARE
    c      record;
    l_how  text;
    l_prev text;
    l_pw   text;
    a      record;
BEGIN
    PERFORM fencegate.fencegate_check_lease_args(acquire.resource, acquire.holder, NULL::bigint, acquire.ttl, false, true);
    -- From here the ttl is its length in seconds (fencegate_check_lease_args
    -- refused months): a day is 24 h, as the bound just checked counted it,
    -- not a calendar day, which now() + ttl would add in the session's time
    -- zone (25 h across a daylight saving change).
    acquire.ttl := make_interval(secs => extract(epoch FROM acquire.ttl));
    -- Before the control row is created or locked (policy.sql).
    SELECT * INTO a FROM fencegate.fencegate_authorize(acquire.resource, NULL::text);
    IF acquire.failover_epoch_jump IS NULL OR acquire.failover_epoch_jump < 0 OR acquire.failover_epoch_jump > 9007199254740992 THEN
        PERFORM fencegate.fencegate_invalid('failover_epoch_jump', format('must be between 0 and 9007199254740992 (2^53), got %s', coalesce(acquire.failover_epoch_jump::text, 'null')));
    END IF;
    -- The jump is applied by the first grant after a promotion to every
    -- resource's epoch, not only this one's: under a rule set, only a
    -- principal allowed to advance epochs may choose one other than the
    -- default (a worker confined to reports/* must not move billing/*'s
    -- epochs to the ceiling, nor turn the failover raise off with 0).
    IF a.principal IS NOT NULL AND acquire.failover_epoch_jump <> 1000000
       AND NOT coalesce((SELECT p.epochs FROM fencegate.principals p WHERE p.name = a.principal), false) THEN
        PERFORM fencegate.fencegate_count('sql_forbidden');
        PERFORM fencegate.fencegate_raise('ZF007',
            format('forbidden: principal %s may not choose the failover jump (%s): it raises every resource''s epoch, which needs the epochs right; omit it for the default (1000000)',
                to_json(a.principal), acquire.failover_epoch_jump),
            'failover_epoch_jump', jsonb_build_object('code', 'forbidden', 'field', 'failover_epoch_jump', 'principal', a.principal));
    END IF;
    PERFORM set_config('synchronous_commit', 'on', true)
    WHERE current_setting('synchronous_commit') IN ('off', 'local');

    -- The authority check and the control row, then its lock (lease.lockResource).
    INSERT INTO fencegate.resources AS r (resource_id, epoch) SELECT acquire.resource, fencegate.fencegate_epoch_authority(acquire.failover_epoch_jump)
    ON CONFLICT (resource_id) DO NOTHING;
    SELECT r.epoch, r.holder, r.lease_expires_at, coalesce(r.lease_expires_at > now(), false) AS live,
           now() - r.renewed_at AS since
    INTO c FROM fencegate.resources r WHERE r.resource_id = acquire.resource FOR UPDATE;

    IF c.live AND c.holder IS NOT NULL AND c.holder <> acquire.holder THEN
        PERFORM fencegate.fencegate_count('sql_lease_held');
        PERFORM fencegate.fencegate_raise('ZF005',
            format('lease on %s held by %s (epoch %s) until %s', to_json(acquire.resource), to_json(c.holder), c.epoch, c.lease_expires_at),
            NULL, jsonb_build_object('code', 'lease_held', 'resource', acquire.resource, 'holder', c.holder,
                'current_epoch', c.epoch, 'expires_at', c.lease_expires_at));
    END IF;
    IF c.epoch >= 9007199254740992 THEN
        PERFORM fencegate.fencegate_invalid('epoch', format('the resource''s epochs are exhausted: %s is at epoch %s, the ceiling (2^53); use a new resource id',
            to_json(acquire.resource), c.epoch));
    END IF;

    -- Every grant is a new epoch, the same holder's too (see lease.Acquire).
    epoch := c.epoch + 1;
    UPDATE fencegate.resources r
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
        SELECT g.how, g.holder INTO l_pw, l_prev FROM fencegate.epoch_grants g
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
    INSERT INTO fencegate.epoch_grants (resource_id, epoch, holder, how, previous_epoch, previous_holder, since_previous_renewal, principal)
    VALUES (acquire.resource, acquire.epoch, acquire.holder, l_how, c.epoch, l_prev, c.since,
            coalesce(a.principal, nullif(current_setting('fencegate.principal', true), '')));
    -- Counted even if the caller rolls the grant back (then never made):
    -- takeovers are watched for their rate, and a rolled-back acquire is
    -- rare.
    PERFORM fencegate.fencegate_count('sql_takeover_' || l_how);
END
$$;

-- renew: lease.Issuer.Renew. Extends holder's lease by ttl from now, only
-- while epoch is the current one and held by holder (also after it
-- expired, while nobody took over); else ZF002. Keeps the epoch.
CREATE OR REPLACE FUNCTION fencegate.renew(resource text, holder text, epoch bigint, ttl interval, OUT expires_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM fencegate.fencegate_check_lease_args(renew.resource, renew.holder, renew.epoch, renew.ttl, true, true);
    renew.ttl := make_interval(secs => extract(epoch FROM renew.ttl)); -- as acquire's
    -- Before the control row is locked (policy.sql).
    PERFORM fencegate.fencegate_authorize(renew.resource, NULL::text);
    PERFORM set_config('synchronous_commit', 'on', true)
    WHERE current_setting('synchronous_commit') IN ('off', 'local');
    -- One conditional update: the check and the extension are one step.
    UPDATE fencegate.resources r
    SET lease_expires_at = now() + renew.ttl, renewed_at = now(), updated_at = now()
    WHERE r.resource_id = renew.resource AND r.epoch = renew.epoch AND r.holder = renew.holder
    RETURNING r.lease_expires_at INTO expires_at;
    IF NOT FOUND THEN
        PERFORM fencegate.fencegate_stale_lease(renew.resource, renew.holder, renew.epoch);
    END IF;
END
$$;

-- release: lease.Issuer.Release. Frees holder's lease; the epoch stays, so
-- the next acquire gets epoch + 1. Releasing an already released lease of
-- the current epoch succeeds; else ZF002.
CREATE OR REPLACE FUNCTION fencegate.release(resource text, holder text, epoch bigint)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
#variable_conflict use_variable
BEGIN
    PERFORM fencegate.fencegate_check_lease_args(release.resource, release.holder, release.epoch, NULL::interval, true, false);
    -- Before the control row is locked (policy.sql).
    PERFORM fencegate.fencegate_authorize(release.resource, NULL::text);
    PERFORM set_config('synchronous_commit', 'on', true)
    WHERE current_setting('synchronous_commit') IN ('off', 'local');
    UPDATE fencegate.resources r
    SET holder = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE r.resource_id = release.resource AND r.epoch = release.epoch
      AND (r.holder = release.holder OR r.holder IS NULL);
    IF NOT FOUND THEN
        PERFORM fencegate.fencegate_stale_lease(release.resource, release.holder, release.epoch);
    END IF;
END
$$;

-- Least authority: the interface runs with its owner's rights, so nobody
-- may call it but the roles granted to (docs/sql.md):
--   GRANT USAGE ON SCHEMA fencegate TO worker;
--   GRANT EXECUTE ON FUNCTION fencegate.enqueue(text, bigint, text, text, jsonb, text, text) TO worker;
-- (and acquire, renew, release for a worker that takes its leases here).
-- CREATE OR REPLACE keeps the grants made since; a function created anew
-- is executable by PUBLIC until these, in the same transaction, revoke it.
REVOKE EXECUTE ON FUNCTION fencegate.enqueue(text, bigint, text, text, jsonb, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.acquire(text, text, interval, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.renew(text, text, bigint, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.release(text, text, bigint) FROM PUBLIC;
