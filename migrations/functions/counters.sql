-- fencegate_count advances the counter fence_count_<p_name> (a sequence of
-- migrations/00024_fence_counters.sql): a refusal or a grant by a worker
-- outside the gateway's processes, counted where a scrape of the relay's
-- processes reads it. A sequence, because a refusal rolls back the
-- refusing transaction and nextval() stays taken. The name is built at run
-- time in this schema (read from a name of fencegate's, which the
-- migration renames into it). Executable by its owner only: the SQL
-- interface's functions (SECURITY DEFINER) and the CLI, which connects
-- as a role that may write fencegate's tables; a worker's role cannot
-- inflate a count.
CREATE OR REPLACE FUNCTION fencegate.fencegate_count(p_name text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM nextval(format('%I.%I', split_part('fencegate.intents', '.', 1), 'fence_count_' || p_name)::regclass);
END
$$;
REVOKE EXECUTE ON FUNCTION fencegate.fencegate_count(text) FROM PUBLIC;
