-- The rule set's check (package policy, docs/policy.md), called by the SQL
-- interface's functions before anything else they do, so that a role
-- outside its principal's scope learns nothing (no epoch, no holder) and
-- locks nothing (no control row).
--
-- Until a rule set is applied (policy_history is empty), every role that
-- was granted the interface may use it as before: principal NULL, keys as
-- given. From the first `gateway policy apply` on, the calling role
-- (session_user: the role that logged in, which SET ROLE does not change)
-- must be mapped to a principal of role worker:
--   ZF006 no_principal  the role is mapped to no principal (COLUMN: role)
--   ZF007 forbidden     the principal may not: COLUMN names what (role,
--                       resource, kind), the DETAIL the principal

-- fencegate_principal_allows raises ZF007 unless principal p_name, of the
-- rule set in force, is a worker allowed p_resource and p_kind (NULL: no
-- kind to check, a lease), and, with p_epochs, to advance epochs. It
-- returns the principal's key scope.
CREATE OR REPLACE FUNCTION fencegate.fencegate_principal_allows(p_name text, p_resource text, p_kind text, p_epochs boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p fencegate.principals%ROWTYPE;
BEGIN
    SELECT * INTO p FROM fencegate.principals WHERE name = p_name;
    IF NOT FOUND THEN
        PERFORM fencegate.fencegate_raise('ZF007', format('forbidden: principal %s is not in the rule set in force', to_json(p_name)),
            'principal', jsonb_build_object('code', 'forbidden', 'field', 'principal', 'principal', p_name));
    END IF;
    IF p.role <> 'worker' THEN
        PERFORM fencegate.fencegate_raise('ZF007', format('forbidden: principal %s is an %s, not a worker', to_json(p_name), p.role),
            'role', jsonb_build_object('code', 'forbidden', 'field', 'role', 'principal', p_name));
    END IF;
    -- A pattern is exact, "prefix*", or "*" (policy.Allows).
    IF NOT EXISTS (SELECT 1 FROM unnest(p.resource_patterns) AS pat
                   WHERE pat = p_resource
                      OR (right(pat, 1) = '*' AND starts_with(p_resource, left(pat, -1)))) THEN
        PERFORM fencegate.fencegate_raise('ZF007', format('forbidden: principal %s may not touch resource %s', to_json(p_name), to_json(p_resource)),
            'resource', jsonb_build_object('code', 'forbidden', 'field', 'resource', 'principal', p_name, 'resource', p_resource));
    END IF;
    IF p_kind IS NOT NULL AND NOT ('*' = ANY (p.kinds) OR p_kind = ANY (p.kinds)) THEN
        PERFORM fencegate.fencegate_raise('ZF007', format('forbidden: principal %s may not enqueue kind %s', to_json(p_name), to_json(p_kind)),
            'kind', jsonb_build_object('code', 'forbidden', 'field', 'kind', 'principal', p_name, 'kind', p_kind));
    END IF;
    IF p_epochs AND NOT p.epochs THEN
        PERFORM fencegate.fencegate_raise('ZF007', format('forbidden: principal %s may not advance epochs', to_json(p_name)),
            'epochs', jsonb_build_object('code', 'forbidden', 'field', 'epochs', 'principal', p_name));
    END IF;
    RETURN p.key_scope;
END
$$;

-- fencegate_check_principal is the check of the Go client's and the
-- issuer's paths (outbox, lease: the HTTP intake, gateway enqueue, a Go
-- worker), which name their principal in the transaction's
-- fencegate.principal setting — unless the login role is mapped to a
-- principal (sql_roles), which is then the principal whatever the setting
-- says: NULL when no rule set was ever applied; ZF006 naming principal
-- when none is named; else fencegate_principal_allows.
--
-- SECURITY DEFINER: it reads the rule set with its owner's rights, so a
-- worker's role needs no grant on the rule set's tables (a role granted
-- fencegate's tables before they existed keeps working); it may be called
-- by anyone and tells only what the caller's principal may do: the setting
-- counts only for a role granted the tables it guards.
CREATE OR REPLACE FUNCTION fencegate.fencegate_check_principal(p_resource text, p_kind text, p_epochs boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    l_name text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM fencegate.policy_history) THEN
        RETURN NULL;
    END IF;
    SELECT r.principal INTO l_name FROM fencegate.principal_roles r WHERE r.role_name = session_user;
    -- The session's setting names the principal only for a role that could
    -- write fencegate's tables itself (the gateway's, a Go worker's: the
    -- paths that set it). A role that reaches fencegate only through the
    -- SQL interface is its mapping or nobody: naming another principal, it
    -- would learn that principal's scope and destinations.
    IF l_name IS NULL AND (has_table_privilege(session_user, 'fencegate.intents', 'INSERT')
                           OR has_table_privilege(session_user, 'fencegate.resources', 'UPDATE')) THEN
        l_name := nullif(current_setting('fencegate.principal', true), '');
    END IF;
    IF l_name IS NULL THEN
        PERFORM fencegate.fencegate_raise('ZF006',
            'no principal: a rule set is in force (gateway policy show) and this caller names no principal (outbox.Config.Principal, --principal, a token''s principal)',
            'principal', jsonb_build_object('code', 'no_principal', 'field', 'principal'));
    END IF;
    RETURN fencegate.fencegate_principal_allows(l_name, p_resource, p_kind, p_epochs);
END
$$;

-- fencegate_rules is the rule set's whole check of one intent on the Go
-- client's path (fencegate_enqueue, the batch): the principal
-- (fencegate_check_principal), its key scope (the effective key, returned)
-- and the destinations. Without a rule set it returns p_key at the cost of
-- one probe. SECURITY DEFINER for the reason above.
CREATE OR REPLACE FUNCTION fencegate.fencegate_rules(p_resource text, p_kind text, p_operation text, p_key text, p_payload jsonb)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM fencegate.policy_history) THEN
        RETURN p_key;
    END IF;
    IF fencegate.fencegate_check_principal(p_resource, p_kind, false) = 'resource' THEN
        p_key := fencegate.fencegate_resource_key(p_resource, p_operation, p_key);
    END IF;
    PERFORM fencegate.fencegate_check_destination(p_kind, p_payload);
    RETURN p_key;
END
$$;

-- fencegate_rule_set_applied reports whether a rule set was ever applied
-- (the batch asks once, not per intent). SECURITY DEFINER for the reason
-- above.
CREATE OR REPLACE FUNCTION fencegate.fencegate_rule_set_applied()
RETURNS boolean
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT EXISTS (SELECT 1 FROM fencegate.policy_history) $$;

-- fencegate_authorize is the SQL interface's check: the principal the
-- calling role acts as (NULL, with key scope NULL, when no rule set was
-- ever applied), after fencegate_principal_allows.
-- Its refusals are counted (fencegate_count: sql_forbidden) before they
-- roll the caller's transaction back; the block that catches them exists
-- only once a rule set was applied.
CREATE OR REPLACE FUNCTION fencegate.fencegate_authorize(p_resource text, p_kind text, OUT principal text, OUT key_scope text)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM fencegate.policy_history) THEN
        RETURN;
    END IF;
    BEGIN
        SELECT r.principal INTO principal FROM fencegate.principal_roles r WHERE r.role_name = session_user;
        IF NOT FOUND THEN
            PERFORM fencegate.fencegate_raise('ZF006',
                format('no principal: role %s is mapped to no principal of the rule set in force (gateway policy show); it may do nothing', to_json(session_user::text)),
                'role', jsonb_build_object('code', 'no_principal', 'field', 'role', 'role', session_user::text));
        END IF;
        key_scope := fencegate.fencegate_principal_allows(principal, p_resource, p_kind, false);
    EXCEPTION WHEN SQLSTATE 'ZF006' OR SQLSTATE 'ZF007' THEN
        PERFORM fencegate.fencegate_count('sql_forbidden');
        RAISE;
    END;
END
$$;

-- fencegate_scoped_key is the effective idempotency key of key under
-- resource when the key scope is resource: "<bytes of resource>:<resource>/<key>".
-- The length makes it unambiguous: resource "billing" with key "eu/x" and
-- resource "billing/eu" with key "x" are two keys (outbox.ScopedKey).
CREATE OR REPLACE FUNCTION fencegate.fencegate_scoped_key(p_resource text, p_key text)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT octet_length(p_resource)::text || ':' || p_resource || '/' || p_key $$;

-- fencegate_resource_key is the effective key of an intent under the
-- resource key scope: fencegate_scoped_key of its key, the operation id
-- standing in for none (or for the default "<resource>/<operation_id>" a
-- client filled in), kept as it is when already scoped for the resource;
-- ZF004 naming idempotency_key over 255 bytes.
CREATE OR REPLACE FUNCTION fencegate.fencegate_resource_key(p_resource text, p_operation text, p_key text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k text := CASE WHEN coalesce(p_key, '') = '' OR p_key = p_resource || '/' || p_operation THEN p_operation ELSE p_key END;
BEGIN
    IF NOT starts_with(k, fencegate.fencegate_scoped_key(p_resource, '')) THEN
        k := fencegate.fencegate_scoped_key(p_resource, k);
    END IF;
    IF octet_length(k) > 255 THEN
        PERFORM fencegate.fencegate_invalid('idempotency_key', format('the effective key %s (key scope resource) is %s bytes, over the limit of 255; pass a shorter key',
            to_json(k), octet_length(k)));
    END IF;
    RETURN k;
END
$$;

-- fencegate_scoped_shape reports whether key has the form of a scoped key
-- ("<n>:<n bytes>/…"): such a key is made only by the scope of the
-- resource it names, and refused when given under the global scope, so
-- that no principal can take another resource's scoped keys.
CREATE OR REPLACE FUNCTION fencegate.fencegate_scoped_shape(p_key text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((
        SELECT get_byte(x.b, octet_length(x.m[1]) + 1 + x.m[1]::int) = 47 -- '/'
        FROM (SELECT convert_to(p_key, 'UTF8') AS b, regexp_match(p_key, '^([1-9][0-9]{0,2}):') AS m) x
        WHERE x.m IS NOT NULL AND length(x.b) > octet_length(x.m[1]) + 1 + x.m[1]::int), false)
$$;

-- fencegate_check_destination checks an intent's payload against the rule
-- set's destination rules of its kind (destination_policies; none: not
-- confined here), raising ZF004 naming the payload's field, as the intake
-- refuses a destination outside the adapter's flags. Called by
-- fencegate_enqueue and the batch, so every way in (Go, the CLI, the HTTP
-- intake, the SQL interface) is held to the same rules. It is never looser
-- than the rules say: what it cannot read (an address or a URL of an
-- unusual form) it refuses.
CREATE OR REPLACE FUNCTION fencegate.fencegate_check_destination(p_kind text, p_payload jsonb)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r     jsonb;
    a     text;
    l     text;
    i     int;
    addrs text[];
    f     text;
    u     text;
    m     text[];
    auth  text;
    h     text;
    p     int;
    t     text;
    ok    boolean;
BEGIN
    SELECT d.rules INTO r FROM fencegate.destination_policies d WHERE d.kind = p_kind;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    CASE p_kind
    WHEN 'email' THEN
        -- An address is local@domain or Name <local@domain>
        -- (emailkind.Address); the domain is after its last '@'.
        IF jsonb_array_length(coalesce(r -> 'senders', '[]')) > 0 THEN
            a := btrim(coalesce(substring(p_payload ->> 'from' from '<([^<>]*)>\s*$'), p_payload ->> 'from'));
            IF a IS NULL OR NOT EXISTS (
                SELECT 1 FROM jsonb_array_elements_text(r -> 'senders') AS e(v)
                WHERE CASE WHEN strpos(e.v, '@') > 0 THEN lower(e.v) = lower(a)
                           ELSE lower(e.v) = lower(split_part(a, '@', -1)) END) THEN
                PERFORM fencegate.fencegate_invalid('payload.from', format('%s is not an allowed sender (the rule set''s destinations.email.senders)', to_json(a)));
            END IF;
        END IF;
        IF jsonb_array_length(coalesce(r -> 'recipient_domains', '[]')) > 0 THEN
            FOREACH l IN ARRAY ARRAY['to', 'cc', 'bcc'] LOOP
                IF jsonb_typeof(p_payload -> l) = 'array' THEN
                    addrs := ARRAY(SELECT jsonb_array_elements_text(p_payload -> l));
                ELSIF jsonb_typeof(p_payload -> l) = 'string' THEN
                    addrs := ARRAY[p_payload ->> l];
                ELSE
                    addrs := '{}';
                END IF;
                FOR i IN 1 .. coalesce(array_length(addrs, 1), 0) LOOP
                    a := btrim(coalesce(substring(addrs[i] from '<([^<>]*)>\s*$'), addrs[i]));
                    IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(r -> 'recipient_domains') AS e(v)
                                   WHERE lower(e.v) = lower(split_part(a, '@', -1))) THEN
                        PERFORM fencegate.fencegate_invalid(format('payload.%s[%s]', l, i - 1),
                            format('%s is not at an allowed domain (the rule set''s destinations.email.recipient_domains)', to_json(a)));
                    END IF;
                END LOOP;
            END LOOP;
        END IF;
    WHEN 'webhook' THEN
        FOREACH f IN ARRAY ARRAY['url', 'lookup_url'] LOOP
            u := p_payload ->> f;
            CONTINUE WHEN coalesce(u, '') = '' AND f = 'lookup_url';
            -- The authority of scheme://authority/…; the port, or the
            -- scheme's (webhook's hostPort).
            m := regexp_match(coalesce(u, ''), '^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)');
            auth := m[2];
            IF auth ~ '^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$' THEN
                h := substring(auth from '^\[([^\]]*)\]');
                p := substring(auth from '\]:([0-9]+)$')::int;
            ELSIF auth ~ '^[A-Za-z0-9._-]+(:[0-9]{1,5})?$' THEN
                h := split_part(auth, ':', 1);
                p := nullif(split_part(auth, ':', 2), '')::int;
            ELSE
                h := NULL;
            END IF;
            p := coalesce(p, CASE WHEN lower(m[1]) = 'https' THEN 443 ELSE 80 END);
            h := lower(rtrim(h, '.'));
            ok := h IS NOT NULL AND EXISTS (
                SELECT 1 FROM jsonb_array_elements_text(r -> 'hosts') AS e(v),
                     LATERAL (SELECT CASE WHEN e.v ~ '^\[' THEN substring(e.v from '^\[([^\]]*)\]')
                                          ELSE split_part(e.v, ':', 1) END AS host,
                                     CASE WHEN e.v ~ '^\[' THEN substring(e.v from '\]:([0-9]+)$')::int
                                          ELSE nullif(split_part(e.v, ':', 2), '')::int END AS port) x
                WHERE lower(rtrim(x.host, '.')) = h AND (x.port IS NULL OR x.port = p));
            -- The host alone is named: never the authority or the URL,
            -- whose user:password@ or query may hold a credential.
            IF NOT ok AND h IS NULL THEN
                PERFORM fencegate.fencegate_invalid('payload.' || f, 'names no host the rule set''s destinations.webhook.hosts can allow (scheme://host[:port]/…, no user:password@)');
            ELSIF NOT ok THEN
                PERFORM fencegate.fencegate_invalid('payload.' || f, format('host %s (port %s) is not an allowed destination (the rule set''s destinations.webhook.hosts)', to_json(h), p));
            END IF;
        END LOOP;
    WHEN 'file' THEN
        -- "dir/**": anything under dir; else the whole target, "*" and
        -- "?" not crossing "/" (path.Match over the characters the rule
        -- set allows in a pattern).
        t := p_payload ->> 'target';
        IF t IS NULL OR NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements_text(r -> 'targets') AS e(v)
            WHERE CASE WHEN right(e.v, 3) = '/**' THEN starts_with(t, left(e.v, -2))
                       ELSE t ~ ('^' || replace(replace(replace(e.v, '.', '\.'), '*', '[^/]*'), '?', '[^/]') || '$') END) THEN
            PERFORM fencegate.fencegate_invalid('payload.target', format('%s matches none of the allowed targets (the rule set''s destinations.file.targets)', to_json(t)));
        END IF;
    WHEN 's3' THEN
        -- No bucket: the gateway's --s3-bucket.
        IF coalesce(p_payload ->> 'bucket', '') <> '' AND NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements_text(r -> 'buckets') AS e(v) WHERE e.v = p_payload ->> 'bucket') THEN
            PERFORM fencegate.fencegate_invalid('payload.bucket', format('%s is not an allowed bucket (the rule set''s destinations.s3.buckets)', to_json(p_payload ->> 'bucket')));
        END IF;
    ELSE
        NULL;
    END CASE;
END
$$;

REVOKE EXECUTE ON FUNCTION fencegate.fencegate_principal_allows(text, text, text, boolean) FROM PUBLIC;
-- Called on every way in, by whatever role enqueues or grants.
GRANT EXECUTE ON FUNCTION fencegate.fencegate_check_principal(text, text, boolean) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencegate.fencegate_rules(text, text, text, text, jsonb) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencegate.fencegate_rule_set_applied() TO PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_authorize(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_scoped_key(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_scoped_shape(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_resource_key(text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_check_destination(text, jsonb) FROM PUBLIC;
