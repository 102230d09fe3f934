-- The SQL interface's check of a payload (fencegate_check_payload, called by
-- enqueue) and its readers of JSON fields, with the rules of the Go
-- parsers (adapters/*/…kind, internal/kindcheck) or stricter ones: an email
-- address or URL the SQL checker cannot prove valid is refused
-- (TestSQLPayloadRulesNeverLooser). Each kind's own rules are beside it:
-- payload_email.sql, payload_file.sql, payload_webhook.sql (s3 uses the
-- file kind's).

-- fencegate_payload_string reads the string field p_name of an object:
-- NULL when absent or JSON null (kindcheck.String), else it must be a
-- string.
CREATE OR REPLACE FUNCTION fencegate.fencegate_payload_string(p_obj jsonb, p_name text, p_field text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v jsonb := p_obj -> p_name;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'string' THEN
        PERFORM fencegate.fencegate_invalid(p_field, 'must be a string');
    END IF;
    RETURN v #>> '{}';
END
$$;

-- fencegate_payload_strings reads a field given as one string or an array
-- of strings (kindcheck.Strings); NULL when absent.
CREATE OR REPLACE FUNCTION fencegate.fencegate_payload_strings(p_obj jsonb, p_name text, p_what text)
RETURNS text[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
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
        PERFORM fencegate.fencegate_invalid('payload.' || p_name, format('must be %s or an array of them', p_what));
    END IF;
    FOR e IN SELECT x FROM jsonb_array_elements(v) AS x LOOP
        IF jsonb_typeof(e) <> 'string' THEN
            PERFORM fencegate.fencegate_invalid(format('payload.%s[%s]', p_name, i), 'must be a string');
        END IF;
        out := out || (e #>> '{}');
        i := i + 1;
    END LOOP;
    RETURN out;
END
$$;

-- fencegate_blank: strings.TrimSpace(s) == "" (unicode.IsSpace's set).
CREATE OR REPLACE FUNCTION fencegate.fencegate_blank(s text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN s IS NULL OR s !~ '[^\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]';
END
$$;

-- fencegate_payload_only refuses a field of p that is not one of fields
-- (kindcheck.Only), naming it: names compared exactly ("Bcc" is not
-- "bcc"), the first unknown one in byte order named, "payload" for an
-- empty name; what is "an email", "a file", "an s3" or "a webhook".
CREATE OR REPLACE FUNCTION fencegate.fencegate_payload_only(p jsonb, what text, fields text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k    text;
    near text;
    list text := array_to_string(fields, ', ');
BEGIN
    FOR k IN SELECT x FROM jsonb_object_keys(p) AS x ORDER BY x COLLATE "C" LOOP
        IF k <> ALL (fields) THEN
            IF k = '' THEN
                PERFORM fencegate.fencegate_invalid('payload', format('has a field with an empty name, which is not a field of %s payload (fields: %s)', what, list));
            END IF;
            SELECT f INTO near FROM unnest(fields) AS f WHERE lower(f) = lower(k) LIMIT 1;
            IF near IS NOT NULL THEN
                PERFORM fencegate.fencegate_invalid('payload.' || k, format('is not a field of %s payload: field names are case-sensitive, did you mean %s? (fields: %s)', what, to_json(near), list));
            END IF;
            PERFORM fencegate.fencegate_invalid('payload.' || k, format('is not a field of %s payload (fields: %s)', what, list));
        END IF;
    END LOOP;
END
$$;

-- fencegate_payload_string_map reads the field p_name, an object of string
-- values (kindcheck.StringMap): NULL when absent or JSON null.
CREATE OR REPLACE FUNCTION fencegate.fencegate_payload_string_map(p jsonb, p_name text)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v jsonb := p -> p_name;
    k text;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'object' THEN
        PERFORM fencegate.fencegate_invalid('payload.' || p_name, 'must be an object of string values');
    END IF;
    FOR k IN SELECT jsonb_object_keys(v) ORDER BY 1 LOOP
        IF jsonb_typeof(v -> k) <> 'string' THEN
            PERFORM fencegate.fencegate_invalid('payload.' || p_name || '.' || k, 'must be a string');
        END IF;
    END LOOP;
    RETURN v;
END
$$;

-- fencegate_check_payload checks a payload of a built-in kind with its
-- rules (the Go parsers' order, so the first refusal names the same field),
-- refusing any other kind.
CREATE OR REPLACE FUNCTION fencegate.fencegate_check_payload(p_kind text, p jsonb)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
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
        PERFORM fencegate.fencegate_invalid('payload', 'must be a JSON object');
    END IF;
    -- The common payloads pass in one expression: PL/pgSQL prepares each
    -- expression it evaluates again in every transaction, and the field
    -- by field checks below are dozens of them (measured: an enqueue
    -- through the interface, each in its own transaction, took about
    -- 0.3 ms more than the Go client's without this). Everything accepted
    -- here the checks below accept too; whatever is not, they judge.
    IF p_kind = 'email'
       AND p - ARRAY['to', 'from', 'subject', 'text', 'html'] = '{}'::jsonb
       AND jsonb_typeof(p -> 'to') = 'string' AND fencegate.fencegate_email_address_ok(p ->> 'to')
       AND p -> 'cc' IS NULL AND p -> 'bcc' IS NULL
       AND jsonb_typeof(p -> 'from') = 'string' AND fencegate.fencegate_email_address_ok(p ->> 'from')
       AND jsonb_typeof(p -> 'subject') = 'string' AND NOT fencegate.fencegate_blank(p ->> 'subject') AND (p ->> 'subject') !~ '[\r\n]'
       AND (p -> 'text' IS NULL OR jsonb_typeof(p -> 'text') = 'string')
       AND (p -> 'html' IS NULL OR jsonb_typeof(p -> 'html') = 'string')
       AND (coalesce(p ->> 'text', '') <> '' OR coalesce(p ->> 'html', '') <> '')
    THEN
        RETURN;
    END IF;
    IF p_kind = 'file'
       AND p - ARRAY['target', 'content', 'content_base64'] = '{}'::jsonb
       AND jsonb_typeof(p -> 'target') = 'string'
       -- segments that start with a letter, a digit or '_': none empty,
       -- '.', '..', a dotfile (so none reserved) or an option ('-'), not
       -- absolute, no control or format character
       -- (ASCII: the bounds are bytes; filekind.ValidateNameLengths)
       AND (p ->> 'target') ~ '^([A-Za-z0-9_][A-Za-z0-9._-]{0,254}/)*[A-Za-z0-9_][A-Za-z0-9._-]{0,234}$'
       AND ((jsonb_typeof(p -> 'content') = 'string' AND p -> 'content_base64' IS NULL)
            OR (jsonb_typeof(p -> 'content_base64') = 'string' AND p -> 'content' IS NULL
                AND fencegate.fencegate_base64_ok(p ->> 'content_base64')))
    THEN
        RETURN;
    END IF;
    CASE p_kind
    WHEN 'email' THEN
        -- emailkind.Parse: only its fields, then the address lists, then
        -- from, subject, text, html as strings, then Validate.
        PERFORM fencegate.fencegate_payload_only(p, 'an email', ARRAY['to', 'cc', 'bcc', 'from', 'subject', 'text', 'html']);
        FOREACH l IN ARRAY lists LOOP
            PERFORM fencegate.fencegate_payload_strings(p, l, 'an address');
        END LOOP;
        PERFORM fencegate.fencegate_payload_string(p, 'from', 'payload.from'),
                fencegate.fencegate_payload_string(p, 'subject', 'payload.subject'),
                fencegate.fencegate_payload_string(p, 'text', 'payload.text'),
                fencegate.fencegate_payload_string(p, 'html', 'payload.html');
        IF coalesce(cardinality(fencegate.fencegate_payload_strings(p, 'to', 'an address')), 0) = 0 THEN
            PERFORM fencegate.fencegate_invalid('payload.to', 'is required (at least one address)');
        END IF;
        FOREACH l IN ARRAY lists LOOP
            addrs := coalesce(fencegate.fencegate_payload_strings(p, l, 'an address'), '{}');
            FOR i IN 1 .. coalesce(array_length(addrs, 1), 0) LOOP
                IF NOT fencegate.fencegate_email_address_ok(addrs[i]) THEN
                    PERFORM fencegate.fencegate_invalid(format('payload.%s[%s]', l, i - 1),
                        format('%s is not an email address the SQL interface accepts (local@domain, or Name <local@domain>)', to_json(addrs[i])));
                END IF;
            END LOOP;
        END LOOP;
        s := fencegate.fencegate_payload_string(p, 'from', 'payload.from');
        IF fencegate.fencegate_blank(s) THEN
            PERFORM fencegate.fencegate_invalid('payload.from', 'is required');
        END IF;
        IF NOT fencegate.fencegate_email_address_ok(s) THEN
            PERFORM fencegate.fencegate_invalid('payload.from', format('%s is not an email address the SQL interface accepts (local@domain, or Name <local@domain>)', to_json(s)));
        END IF;
        s := fencegate.fencegate_payload_string(p, 'subject', 'payload.subject');
        IF fencegate.fencegate_blank(s) THEN
            PERFORM fencegate.fencegate_invalid('payload.subject', 'is required');
        END IF;
        IF s ~ '[\r\n]' THEN
            PERFORM fencegate.fencegate_invalid('payload.subject', 'must be one line');
        END IF;
        IF coalesce(fencegate.fencegate_payload_string(p, 'text', 'payload.text'), '') = ''
           AND coalesce(fencegate.fencegate_payload_string(p, 'html', 'payload.html'), '') = '' THEN
            PERFORM fencegate.fencegate_invalid('payload.text', 'text or html is required');
        END IF;
    WHEN 'file' THEN
        -- filekind.Parse: only its fields, then target, content,
        -- content_base64.
        PERFORM fencegate.fencegate_payload_only(p, 'a file', ARRAY['target', 'content', 'content_base64']);
        s := fencegate.fencegate_payload_string(p, 'target', 'payload.target');
        PERFORM fencegate.fencegate_payload_string(p, 'content', 'payload.content'),
                fencegate.fencegate_payload_string(p, 'content_base64', 'payload.content_base64');
        PERFORM fencegate.fencegate_check_target('payload.target', s);
        -- filekind.ValidateNameLengths: names a file system takes, the
        -- file's own 235 bytes for the adapter's side files beside it.
        SELECT format(CASE WHEN x.n < x.total
                           THEN 'directory name %s is %s bytes; a file system takes at most 255'
                           ELSE 'the file name is %2$s bytes; at most 235 (the adapter keeps .<name>.fencegate.json.tmp beside it, and a file system takes 255)' END,
                      x.n, octet_length(x.seg))
        INTO k
        FROM (SELECT seg, n, count(*) OVER () AS total
              FROM unnest(string_to_array(s, '/')) WITH ORDINALITY AS u(seg, n)) x
        WHERE octet_length(x.seg) > CASE WHEN x.n < x.total THEN 255 ELSE 235 END
        ORDER BY x.n LIMIT 1;
        IF k IS NOT NULL THEN
            PERFORM fencegate.fencegate_invalid('payload.target', k);
        END IF;
        PERFORM fencegate.fencegate_check_content(p);
    WHEN 's3' THEN
        -- s3kind.Parse: only its fields, then bucket, key, content_type,
        -- content, content_base64, metadata, then Validate.
        PERFORM fencegate.fencegate_payload_only(p, 'an s3', ARRAY['bucket', 'key', 'content', 'content_base64', 'content_type', 'metadata']);
        s := fencegate.fencegate_payload_string(p, 'bucket', 'payload.bucket');
        s2 := fencegate.fencegate_payload_string(p, 'key', 'payload.key');
        PERFORM fencegate.fencegate_payload_string(p, 'content_type', 'payload.content_type'),
                fencegate.fencegate_payload_string(p, 'content', 'payload.content'),
                fencegate.fencegate_payload_string(p, 'content_base64', 'payload.content_base64');
        v := fencegate.fencegate_payload_string_map(p, 'metadata');
        IF coalesce(s, '') <> '' AND (octet_length(s) < 3 OR octet_length(s) > 63 OR s !~ '^[a-z0-9][a-z0-9.-]*[a-z0-9]$') THEN
            PERFORM fencegate.fencegate_invalid('payload.bucket', format('%s is not a valid bucket name (3-63 of a-z, 0-9, ''.'', ''-'')', to_json(s)));
        END IF;
        PERFORM fencegate.fencegate_check_target('payload.key', s2);
        IF fencegate.fencegate_s3_reserved_key(s2) THEN
            PERFORM fencegate.fencegate_invalid('payload.key', format('%s is under .fencegate/, reserved for the adapter''s receipts and probes (compared after percent-decoding, without case)', to_json(s2)));
        END IF;
        IF octet_length(s2) > 1024 THEN
            PERFORM fencegate.fencegate_invalid('payload.key', format('must be at most 1024 bytes, got %s', octet_length(s2)));
        END IF;
        PERFORM fencegate.fencegate_check_content(p);
        IF coalesce(fencegate.fencegate_payload_string(p, 'content_type', 'payload.content_type'), '') ~ '[\r\n]' THEN
            PERFORM fencegate.fencegate_invalid('payload.content_type', 'must not contain CR, LF or NUL');
        END IF;
        size := 0;
        IF v IS NOT NULL AND jsonb_typeof(v) = 'object' THEN
            FOR k IN SELECT jsonb_object_keys(v) ORDER BY 1 LOOP
                IF k = '' OR k !~ '^[a-z0-9-]+$' THEN
                    PERFORM fencegate.fencegate_invalid('payload.metadata.' || k, 'must be a lower-case name of letters, digits and ''-''');
                ELSIF left(k, 10) = 'fencegate-' THEN
                    PERFORM fencegate.fencegate_invalid('payload.metadata.' || k, 'is the adapter''s own (fencegate-*) and cannot be set');
                ELSIF (v ->> k) ~ '[\r\n]' THEN
                    PERFORM fencegate.fencegate_invalid('payload.metadata.' || k, 'must not contain CR, LF or NUL');
                END IF;
                size := size + octet_length(k) + octet_length(v ->> k);
            END LOOP;
        END IF;
        IF size > 1024 THEN
            PERFORM fencegate.fencegate_invalid('payload.metadata', format('is %s bytes, over the limit of 1024', size));
        END IF;
    WHEN 'webhook' THEN
        -- webhookkind.Parse: only its fields, then url, method,
        -- content_type, lookup_url, body_base64, headers, then Validate.
        PERFORM fencegate.fencegate_payload_only(p, 'a webhook', ARRAY['url', 'method', 'headers', 'body', 'body_base64', 'content_type', 'lookup_url']);
        PERFORM fencegate.fencegate_payload_string(p, 'url', 'payload.url'),
                fencegate.fencegate_payload_string(p, 'method', 'payload.method'),
                fencegate.fencegate_payload_string(p, 'content_type', 'payload.content_type'),
                fencegate.fencegate_payload_string(p, 'lookup_url', 'payload.lookup_url'),
                fencegate.fencegate_payload_string(p, 'body_base64', 'payload.body_base64');
        -- headers: an object whose values are strings or {"secret": NAME}
        -- (webhookkind.parseHeaders), read in byte order of the names.
        v := p -> 'headers';
        IF v IS NOT NULL AND jsonb_typeof(v) = 'null' THEN
            v := NULL;
        ELSIF v IS NOT NULL AND jsonb_typeof(v) <> 'object' THEN
            PERFORM fencegate.fencegate_invalid('payload.headers', 'must be an object whose values are strings or {"secret": "NAME"}');
        ELSIF v IS NOT NULL THEN
            FOR k IN SELECT h FROM jsonb_object_keys(v) AS h ORDER BY h COLLATE "C" LOOP
                IF NOT (jsonb_typeof(v -> k) = 'string'
                        OR (jsonb_typeof(v -> k) = 'object'
                            AND (SELECT count(*) FROM jsonb_object_keys(v -> k)) = 1
                            AND jsonb_typeof(v -> k -> 'secret') = 'string'
                            AND (v -> k ->> 'secret') <> '')) THEN
                    PERFORM fencegate.fencegate_invalid('payload.headers.' || k, 'must be a string or {"secret": "NAME"}');
                END IF;
            END LOOP;
        END IF;
        PERFORM fencegate.fencegate_check_url('payload.url', fencegate.fencegate_payload_string(p, 'url', 'payload.url'));
        s := fencegate.fencegate_payload_string(p, 'method', 'payload.method');
        IF coalesce(s, '') <> '' AND s <> ALL (ARRAY['POST', 'PUT', 'PATCH', 'DELETE']) THEN
            PERFORM fencegate.fencegate_invalid('payload.method', format('must be one of POST, PUT, PATCH, DELETE, got %s', to_json(s)));
        END IF;
        IF v IS NOT NULL AND jsonb_typeof(v) = 'object' THEN
            FOR k IN SELECT h FROM jsonb_object_keys(v) AS h ORDER BY h COLLATE "C" LOOP
                canon := lower(k);
                IF k !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' THEN
                    PERFORM fencegate.fencegate_invalid('payload.headers.' || k, 'is not a valid header name');
                ELSIF canon = ANY (ARRAY['idempotency-key', 'fencegate-resource', 'fencegate-epoch', 'fencegate-intent-id',
                                         'webhook-id', 'webhook-timestamp', 'webhook-signature']) THEN
                    PERFORM fencegate.fencegate_invalid('payload.headers.' || k, 'is set by the gateway and cannot be overridden');
                ELSIF canon = 'content-type' THEN
                    PERFORM fencegate.fencegate_invalid('payload.headers.' || k, 'is set from the body; give content_type with body_base64');
                ELSIF canon = ANY (ARRAY['host', 'content-length', 'transfer-encoding', 'connection', 'keep-alive',
                                         'proxy-connection', 'te', 'trailer', 'upgrade', 'expect']) THEN
                    PERFORM fencegate.fencegate_invalid('payload.headers.' || k, 'is a connection or framing header and cannot be set');
                ELSIF jsonb_typeof(v -> k) = 'object' THEN
                    IF (v -> k ->> 'secret') !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
                        PERFORM fencegate.fencegate_invalid('payload.headers.' || k, format('secret name %s must be 1 to 64 letters, digits, ''_'', ''-'' or ''.''', to_json(v -> k ->> 'secret')));
                    END IF;
                ELSIF (v ->> k) ~ '[\r\n]' THEN
                    PERFORM fencegate.fencegate_invalid('payload.headers.' || k, 'must not contain CR, LF or NUL');
                ELSIF lower(k) ~ '(auth|token|secret|key|passw|passphrase|cookie|session|credential|jwt)'
                      OR lower(v ->> k) ~ '^[ \t]*(bearer|basic|digest|negotiate)[ \t]' THEN
                    -- webhookkind.Sensitive: a credential given inline.
                    PERFORM fencegate.fencegate_invalid('payload.headers.' || k, 'carries a credential, which must not be stored in an intent: give {"secret": "NAME"}, a secret the gateway holds (--webhook-header-secret NAME=FILE)');
                END IF;
            END LOOP;
        END IF;
        s := fencegate.fencegate_payload_string(p, 'body_base64', 'payload.body_base64');
        s2 := fencegate.fencegate_payload_string(p, 'content_type', 'payload.content_type');
        IF p ? 'body' AND s IS NOT NULL THEN
            PERFORM fencegate.fencegate_invalid('payload.body', 'give at most one of body or body_base64, not both');
        ELSIF s IS NOT NULL THEN
            IF NOT fencegate.fencegate_base64_ok(s) THEN
                PERFORM fencegate.fencegate_invalid('payload.body_base64', 'is not valid base64 (standard alphabet, padded, no whitespace)');
            END IF;
            IF coalesce(s2, '') = '' THEN
                PERFORM fencegate.fencegate_invalid('payload.content_type', 'is required with body_base64');
            END IF;
            IF s2 ~ '[\r\n]' THEN
                PERFORM fencegate.fencegate_invalid('payload.content_type', 'must not contain CR, LF or NUL');
            END IF;
        ELSIF coalesce(s2, '') <> '' THEN
            PERFORM fencegate.fencegate_invalid('payload.content_type', 'applies only to body_base64 (a JSON body is sent as application/json)');
        END IF;
        s := fencegate.fencegate_payload_string(p, 'lookup_url', 'payload.lookup_url');
        IF coalesce(s, '') <> '' THEN
            PERFORM fencegate.fencegate_check_url('payload.lookup_url', s);
        END IF;
    ELSE
        PERFORM fencegate.fencegate_invalid('kind', format('kind %s is not accepted by the SQL interface (it accepts email, file, s3, webhook); '
            'enqueue a program''s own kinds with its Go client or the HTTP intake', to_json(p_kind)));
    END CASE;
END
$$;

-- fencegate_s3_reserved_key: s3kind.ReservedKey. The key's first segment
-- is .fencegate once percent-escapes are decoded (leniently: an invalid
-- one is left as is; up to four levels), '\' is read as '/', '.', '..'
-- and empty segments are resolved, and the segment's trailing dots and
-- spaces dropped; compared without case. Only escapes of printable ASCII
-- (%20-%7F) are decoded: no other byte can spell '.fencegate', '/', '\',
-- '.' or an escape, so the answer is Go's.
CREATE OR REPLACE FUNCTION fencegate.fencegate_s3_reserved_key(k text)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d text := k;
    prev text;
    c text;
    pos int;
    seg text;
    parts text[] := '{}';
BEGIN
    FOR i IN 1..4 LOOP
        prev := d;
        d := '';
        pos := 1;
        WHILE pos <= length(prev) LOOP
            c := substr(prev, pos, 1);
            IF c = '%' AND substr(prev, pos + 1, 2) ~ '^[2-7][0-9A-Fa-f]$' THEN
                d := d || chr(('x' || substr(prev, pos + 1, 2))::bit(8)::int);
                pos := pos + 3;
            ELSE
                d := d || c;
                pos := pos + 1;
            END IF;
        END LOOP;
        EXIT WHEN d = prev;
    END LOOP;
    FOREACH seg IN ARRAY string_to_array(replace(d, '\', '/'), '/') LOOP
        IF seg = '' OR seg = '.' THEN
            CONTINUE;
        ELSIF seg = '..' THEN
            parts := parts[1:cardinality(parts) - 1];
        ELSE
            parts := parts || seg;
        END IF;
    END LOOP;
    RETURN lower(rtrim(coalesce(parts[1], ''), '. ')) = '.fencegate';
END
$$;
