-- The deployment's identity on NATS (table deployment, internal/deployment):
-- a namespace not given at migrate is derived from the cluster's system
-- identifier, the database's name and the schema.

-- fencegate_deployment_sysid: the cluster's system identifier, or NULL
-- where the role may not read it (pg_control_system needs superuser or
-- pg_monitor on some installs).
CREATE OR REPLACE FUNCTION fencegate.fencegate_deployment_sysid() RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT system_identifier::text FROM pg_control_system());
EXCEPTION WHEN insufficient_privilege THEN
    RETURN NULL;
END $$;

-- fencegate_derived_namespace: 'd' and 11 hex digits of md5(system
-- identifier / database name [/ schema]); without the identifier, of a
-- random value (then stable only because it is recorded in deployment).
-- The schema joins the derivation, except for the default schema and
-- public (an install from before schemas, or moved from there: its
-- namespace, and so its stream on NATS, stays what it was).
CREATE OR REPLACE FUNCTION fencegate.fencegate_derived_namespace() RETURNS text
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'd' || substr(md5(coalesce(fencegate.fencegate_deployment_sysid(), gen_random_uuid()::text) || '/' || current_database()
        || CASE WHEN s.name IN ('fencegate', 'public') THEN '' ELSE '/' || s.name END), 1, 11)
    -- The schema's name, read from a name of fencegate's, which the
    -- migration renames into the schema like every other (a schema's name
    -- holds no '.').
    FROM (SELECT split_part('fencegate.deployment', '.', 1) AS name) s
$$;
