-- The email kind's rules (kinds/emailkind).

-- fencegate_email_address_ok: whether s is an address the SQL interface
-- accepts: a plain dot-atom address (local@domain, the domain of letters,
-- digits, '-' and '.'), alone or after a display name of plain words
-- ("Ops Team <ops@example.com>"). Every such string is one net/mail parses
-- (emailkind.Address); quoted local parts, comments and encoded words are
-- not accepted here: send those through the HTTP intake or the Go client.
CREATE OR REPLACE FUNCTION fencegate.fencegate_email_address_ok(s text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
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
