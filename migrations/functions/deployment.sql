-- The deployment's identity on NATS (table deployment, internal/deployment):
-- a namespace not given at migrate is derived from the cluster's system
-- identifier, the database's name and the schema.

-- fencegate_deployment_sysid: the cluster's system identifier, or NULL
-- where the role may not read it (pg_control_system needs superuser or
-- pg_monitor on some installs).
CREATE OR REPLACE FUNCTION fencegate_deployment_sysid() RETURNS text
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
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
CREATE OR REPLACE FUNCTION fencegate_derived_namespace() RETURNS text
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    SELECT 'd' || substr(md5(coalesce(fencegate_deployment_sysid(), gen_random_uuid()::text) || '/' || current_database()
        || CASE WHEN current_schema() IN ('fencegate', 'public') THEN '' ELSE '/' || current_schema() END), 1, 11)
$$;
