-- +goose Up

-- epoch_grants records every change of authority over a resource: each
-- epoch the issuer granted (lease.Issuer.Acquire) or registered from an
-- outside lock service (lease.Issuer.Advance), with who had authority before
-- and how it passed. It is written in the same transaction as the grant, so
-- a grant without its history row (or the reverse) never commits.
--
-- A same-holder re-acquire of a live lease keeps the epoch and is not a
-- change of authority: it is not recorded.
CREATE TABLE epoch_grants (
    resource_id     text        NOT NULL REFERENCES resources (resource_id) ON DELETE CASCADE,
    -- The primary key doubles as a safety net: an epoch is granted at most
    -- once per resource, so a bug that tried to hand out the same epoch
    -- twice fails the grant instead of recording a second owner.
    epoch           bigint      NOT NULL CHECK (epoch >= 1),
    -- holder is NULL for an external advance: authority is outside.
    holder          text,
    -- granted_at is PostgreSQL's clock, like every lease time.
    granted_at      timestamptz NOT NULL DEFAULT now(),
    how             text        NOT NULL
        CHECK (how IN ('free', 'after_expiry', 'released', 'external_advance')),
    previous_epoch  bigint      NOT NULL CHECK (previous_epoch >= 0 AND previous_epoch < epoch),
    previous_holder text,
    -- since_previous_renewal is granted_at minus the previous holder's last
    -- grant or renewal (resources.renewed_at): how long the previous holder
    -- had been silent when authority passed. NULL without a previous holder.
    since_previous_renewal interval,
    PRIMARY KEY (resource_id, epoch)
);

-- +goose Down
DROP TABLE epoch_grants;
