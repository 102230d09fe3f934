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
-- stricter form, for the field p_field.
CREATE OR REPLACE FUNCTION fencegate.fencegate_check_url(p_field text, s text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce(s, '') = '' THEN
        PERFORM fencegate.fencegate_invalid(p_field, 'is required');
    ELSIF octet_length(s) > 2048 THEN
        PERFORM fencegate.fencegate_invalid(p_field, format('must be at most 2048 bytes, got %s', octet_length(s)));
    ELSIF NOT fencegate.fencegate_url_ok(s) THEN
        PERFORM fencegate.fencegate_invalid(p_field, format('%s is not a URL the SQL interface accepts (http or https, a host name, no credentials or fragment)', to_json(s)));
    END IF;
END
$$;
