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
-- fencegate.principal setting: NULL when no rule set was ever applied;
-- ZF006 naming principal when none is named; else
-- fencegate_principal_allows.
CREATE OR REPLACE FUNCTION fencegate.fencegate_check_principal(p_resource text, p_kind text, p_epochs boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    l_name text := nullif(current_setting('fencegate.principal', true), '');
BEGIN
    IF NOT EXISTS (SELECT 1 FROM fencegate.policy_history) THEN
        RETURN NULL;
    END IF;
    IF l_name IS NULL THEN
        PERFORM fencegate.fencegate_raise('ZF006',
            'no principal: a rule set is in force (gateway policy show) and this caller names no principal (outbox.Config.Principal, --principal, a token''s principal)',
            'principal', jsonb_build_object('code', 'no_principal', 'field', 'principal'));
    END IF;
    RETURN fencegate.fencegate_principal_allows(l_name, p_resource, p_kind, p_epochs);
END
$$;

-- fencegate_authorize is the SQL interface's check: the principal the
-- calling role acts as (NULL, with key scope NULL, when no rule set was
-- ever applied), after fencegate_principal_allows.
CREATE OR REPLACE FUNCTION fencegate.fencegate_authorize(p_resource text, p_kind text, OUT principal text, OUT key_scope text)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM fencegate.policy_history) THEN
        RETURN;
    END IF;
    SELECT r.principal INTO principal FROM fencegate.principal_roles r WHERE r.role_name = session_user;
    IF NOT FOUND THEN
        PERFORM fencegate.fencegate_raise('ZF006',
            format('no principal: role %s is mapped to no principal of the rule set in force (gateway policy show); it may do nothing', to_json(session_user::text)),
            'role', jsonb_build_object('code', 'no_principal', 'field', 'role', 'role', session_user::text));
    END IF;
    key_scope := fencegate.fencegate_principal_allows(principal, p_resource, p_kind, false);
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

REVOKE EXECUTE ON FUNCTION fencegate.fencegate_principal_allows(text, text, text, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_check_principal(text, text, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_authorize(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_scoped_key(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_scoped_shape(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_resource_key(text, text, text) FROM PUBLIC;
