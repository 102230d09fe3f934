-- +goose Up

-- Issue 16. The deployment's identity on NATS: its namespace is in the
-- stream's name, the subjects, the durable consumers and every message id,
-- so that two deployments (staging and production, two shards) relaying
-- through one NATS never share messages (internal/wire.Namespace). One
-- row. A namespace not given at migrate (explicit = false) is derived from
-- the cluster's system identifier and the database's name; the gateway
-- derives it again at start when either changed since (a copy made with
-- CREATE DATABASE … TEMPLATE, a dump restored elsewhere), so that a copy
-- never shares the original's namespace. An explicit one (gateway migrate
-- --namespace) is kept as given.
CREATE TABLE IF NOT EXISTS deployment (
    singleton         boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    namespace         text        NOT NULL CHECK (namespace ~ '^[a-z0-9][a-z0-9_-]{0,31}$'),
    explicit          boolean     NOT NULL DEFAULT false,
    database_name     text        NOT NULL,
    system_identifier text,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- fencegate_deployment_sysid: the cluster's system identifier, or NULL
-- where the role may not read it (pg_control_system needs superuser or
-- pg_monitor on some installs).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_deployment_sysid() RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT system_identifier::text FROM pg_control_system());
EXCEPTION WHEN insufficient_privilege THEN
    RETURN NULL;
END $$;
-- +goose StatementEnd

-- fencegate_derived_namespace: 'd' and 11 hex digits of md5(system
-- identifier / database name); without the identifier, of a random value
-- (then stable only because it is recorded).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_derived_namespace() RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT 'd' || substr(md5(coalesce(fencegate_deployment_sysid(), gen_random_uuid()::text) || '/' || current_database()), 1, 11)
$$;
-- +goose StatementEnd

INSERT INTO deployment (namespace, database_name, system_identifier)
SELECT fencegate_derived_namespace(), current_database(), fencegate_deployment_sysid()
ON CONFLICT DO NOTHING;

-- +goose Down
DROP TABLE IF EXISTS deployment;
DROP FUNCTION IF EXISTS fencegate_derived_namespace();
DROP FUNCTION IF EXISTS fencegate_deployment_sysid();
