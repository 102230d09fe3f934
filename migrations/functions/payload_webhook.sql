-- The webhook kind's rules (kinds/webhookkind).

-- fencegate_url_ok: whether s is a URL the SQL interface accepts: http or
-- https, a host of letters, digits, '-' and '.', an optional port, a path
-- and query of unreserved and sub-delim characters and %-escapes, no
-- credentials, no fragment. Every such string passes
-- webhookkind.CheckURL (at most 2048 bytes is checked apart).
CREATE OR REPLACE FUNCTION fencegate.fencegate_url_ok(s text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p constant text := '([A-Za-z0-9._~!$&''()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*';
BEGIN
    RETURN s ~ ('^https?://[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?(:[0-9]{1,5})?(/' || p || ')?(\?' || p || ')?$');
END
$$;

-- fencegate_check_url: webhookkind.CheckURL, with fencegate_url_ok's
-- stricter form, for the field p_field. A refused URL is never echoed (its
-- query or userinfo may hold a credential, and the message reaches the
-- client's and the server's logs): where the reason is one CheckURL
-- gives (the scheme, no host, credentials, a fragment, checked in its
-- order), it says it in CheckURL's words; else it says what the SQL
-- interface takes.
CREATE OR REPLACE FUNCTION fencegate.fencegate_check_url(p_field text, s text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- scheme://authority, as url.Parse splits them (the scheme lower
    -- case); NULL without "://".
    m text[] := regexp_match(s, '^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)');
    scheme text := lower(m[1]);
    host text := regexp_replace(regexp_replace(m[2], '^.*@', ''), ':[0-9]*$', '');
BEGIN
    IF coalesce(s, '') = '' THEN
        PERFORM fencegate.fencegate_invalid(p_field, 'is required');
    ELSIF octet_length(s) > 2048 THEN
        PERFORM fencegate.fencegate_invalid(p_field, format('must be at most 2048 bytes, got %s', octet_length(s)));
    ELSIF fencegate.fencegate_url_ok(s) THEN
        RETURN;
    ELSIF scheme IS NULL THEN
        PERFORM fencegate.fencegate_invalid(p_field, 'must be an http or https URL');
    ELSIF scheme NOT IN ('http', 'https') THEN
        PERFORM fencegate.fencegate_invalid(p_field, format('must be an http or https URL, got scheme %s', to_json(scheme)));
    ELSIF host = '' THEN
        PERFORM fencegate.fencegate_invalid(p_field, 'must name a host');
    ELSIF position('@' IN m[2]) > 0 THEN
        PERFORM fencegate.fencegate_invalid(p_field, 'must not carry credentials (user:password@); send them in headers');
    ELSIF position('#' IN s) > 0 THEN
        PERFORM fencegate.fencegate_invalid(p_field, 'must not have a fragment');
    ELSE
        PERFORM fencegate.fencegate_invalid(p_field, 'is not a URL the SQL interface accepts: http or https in lower case, a host name or IPv4 address, an optional port, a path and query of unreserved and sub-delim characters and %-escapes (escape others, e.g. %7C for |)');
    END IF;
END
$$;
