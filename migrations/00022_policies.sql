-- +goose Up

-- The rule set (docs/policy.md): who may do what, and where effects may go,
-- kept in the database so that every way in reads the same rules. Written
-- only by `gateway policy apply` (package policy), in one transaction that
-- replaces every row and records the document in policy_history.

-- principals: a name, what it may touch (resources exact or "prefix*",
-- "*" for all; kinds, "*" for all; epochs: may advance epochs) and the
-- scope of its idempotency keys.
CREATE TABLE principals (
    name              text PRIMARY KEY,
    role              text NOT NULL CHECK (role IN ('worker', 'operator')),
    resource_patterns text[] NOT NULL,
    kinds             text[] NOT NULL,
    epochs            boolean NOT NULL DEFAULT false,
    key_scope         text NOT NULL CHECK (key_scope IN ('global', 'resource'))
);

-- principal_roles maps a PostgreSQL role (session_user of a worker calling
-- the SQL interface) to its principal: one principal per role.
CREATE TABLE principal_roles (
    role_name text PRIMARY KEY,
    principal text NOT NULL REFERENCES principals (name) ON DELETE CASCADE
);

-- destination_policies: where each kind's effects may go (mail senders and
-- recipient domains, webhook hosts, file targets, S3 buckets), as the
-- document gives them: checked at every enqueue, in the database.
CREATE TABLE destination_policies (
    kind  text PRIMARY KEY,
    rules jsonb NOT NULL
);

-- policy_history: every document applied, whole, with who applied it.
CREATE TABLE policy_history (
    version    bigserial PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now(),
    applied_by text NOT NULL,
    document   jsonb NOT NULL
);

-- +goose Down
DROP TABLE policy_history;
DROP TABLE destination_policies;
DROP TABLE principal_roles;
DROP TABLE principals;
