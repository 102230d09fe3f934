-- The file kind's rules (kinds/filekind), used by s3's too.

-- fencegate_base64_ok: canonical standard base64 with padding, no
-- whitespace: a subset of what Go's base64.StdEncoding decodes.
CREATE OR REPLACE FUNCTION fencegate.fencegate_base64_ok(s text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN s ~ '^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$';
END
$$;

-- fencegate_check_target: filekind.ValidateTarget, for the field p_field
-- (payload.target; payload.key for s3).
CREATE OR REPLACE FUNCTION fencegate.fencegate_check_target(p_field text, t text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seg text;
    bad text;
BEGIN
    IF t IS NULL OR t = '' THEN
        PERFORM fencegate.fencegate_invalid(p_field, 'is required');
    END IF;
    IF left(t, 1) IN ('/', '\') THEN
        PERFORM fencegate.fencegate_invalid(p_field, format('must be relative, got absolute path %s', to_json(t)));
    END IF;
    -- kindcheck.Invisible: control (Cc) and format (Cf) characters, the
    -- list fencegate_check_id has.
    bad := substring(t FROM '[\u0001-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]');
    IF bad IS NOT NULL THEN
        -- U+ and at least four hex digits, as Go's %U (U+E0041, not U+E004).
        PERFORM fencegate.fencegate_invalid(p_field, format('must not contain control or format characters, got U+%s',
            upper(lpad(to_hex(ascii(bad)), greatest(4, length(to_hex(ascii(bad)))), '0'))));
    END IF;
    IF '..' = ANY (string_to_array(t, '/')) THEN
        PERFORM fencegate.fencegate_invalid(p_field, format('must not contain a ".." segment: %s', to_json(t)));
    END IF;
    -- path.Clean(t) = t and t <> '.': no empty or "." segment, no trailing
    -- slash ("a//b", "./a", "a/" and "." are refused).
    IF '' = ANY (string_to_array(t, '/')) OR '.' = ANY (string_to_array(t, '/')) THEN
        PERFORM fencegate.fencegate_invalid(p_field, format('must be a clean relative file path (no empty or "." segments, no trailing slash): %s', to_json(t)));
    END IF;
    FOREACH seg IN ARRAY string_to_array(t, '/') LOOP
        IF left(seg, 1) = '-' THEN
            PERFORM fencegate.fencegate_invalid(p_field, format('segment %s starts with "-", which a command line would take for an option', to_json(seg)));
        END IF;
        -- filekind.Reserved: the adapter's own files, in any case.
        IF left(seg, 1) = '.' AND position('.fencegate.' IN lower(seg)) > 0 THEN
            PERFORM fencegate.fencegate_invalid(p_field, format('segment %s is reserved for the adapter''s own files (.<name>.fencegate.*, in any case)', to_json(seg)));
        END IF;
    END LOOP;
END
$$;

-- fencegate_check_content: kindcheck.Content (exactly one of content and
-- content_base64, the latter valid base64).
CREATE OR REPLACE FUNCTION fencegate.fencegate_check_content(p jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c   text := fencegate.fencegate_payload_string(p, 'content', 'payload.content');
    b64 text := fencegate.fencegate_payload_string(p, 'content_base64', 'payload.content_base64');
BEGIN
    IF c IS NOT NULL AND b64 IS NOT NULL THEN
        PERFORM fencegate.fencegate_invalid('payload.content', 'give exactly one of content or content_base64, not both');
    ELSIF c IS NULL AND b64 IS NULL THEN
        PERFORM fencegate.fencegate_invalid('payload.content', 'one of content or content_base64 is required');
    ELSIF b64 IS NOT NULL AND NOT fencegate.fencegate_base64_ok(b64) THEN
        PERFORM fencegate.fencegate_invalid('payload.content_base64', 'is not valid base64 (standard alphabet, padded, no whitespace)');
    END IF;
END
$$;
