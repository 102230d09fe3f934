-- +goose Up

-- Issue 16, "epochs that survive a failover to an asynchronous standby".
--
-- An asynchronous primary acknowledges a grant before its standby has it.
-- When that primary dies and the standby is promoted, the standby's epochs
-- are behind what was granted, and its next Acquire would hand out an epoch
-- the old primary already gave someone: two holders with one token.
--
-- epoch_authority records which database grants the epochs: its system
-- identifier (pg_control_system(), fixed at initdb and kept by every
-- physical copy: base backups, standbys) and its WAL timeline (a promotion
-- or a point-in-time recovery starts a new, higher one). Every grant
-- (lease.Issuer.Acquire and Advance) compares them with the database's own,
-- in the grant's first statement, and:
--
-- - the same: grants as before;
-- - a higher timeline (a promotion): in the grant's own transaction, raises
--   every resource's epoch by the issuer's jump
--   (lease.WithFailoverEpochJump, `--failover-epoch-jump`), past anything
--   the old primary can have granted after the standby's last replayed
--   commit, clears every lease (its epoch was raised away from its holder),
--   records a 'failover' grant per resource, raises the floor new resources
--   start from by the same jump (the old primary may have created resources
--   the standby never saw), and records the new timeline;
-- - a lower timeline (a restore from an older backup) or another system
--   identifier (another database, a logical copy, pg_upgrade): refuses the
--   grant with SQLSTATE ZF001 (lease.ErrAuthorityChanged), changing nothing.
--
-- No row at all (an operator deleted it to accept a moved or restored
-- database: docs/guarantees.md) counts as an unknown history: the next
-- grant records the database and raises every epoch by the jump.
CREATE TABLE epoch_authority (
    -- One row: the primary key on a constant true.
    singleton         boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    system_identifier bigint      NOT NULL,
    timeline_id       bigint      NOT NULL CHECK (timeline_id >= 1),
    -- epoch_floor is the epoch a new resource starts from (its first grant
    -- is floor + 1): the sum of the jumps so far, at most 2^53.
    epoch_floor       bigint      NOT NULL DEFAULT 0
        CHECK (epoch_floor >= 0 AND epoch_floor <= 9007199254740992),
    -- The last jump applied (0: none yet) and when this row was written.
    last_jump         bigint      NOT NULL DEFAULT 0 CHECK (last_jump >= 0),
    recorded_at       timestamptz NOT NULL DEFAULT now()
);

-- fencegate_system_identifier is the cluster's system identifier. It is
-- read from the control file once per session and kept in a session
-- setting: it cannot change under a running server, and a session talks to
-- one server for its whole life (a different server behind the same address
-- means new sessions), so later grants do not read the file again.
-- +goose StatementBegin
CREATE FUNCTION fencegate_system_identifier() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    l_id bigint := nullif(current_setting('fencegate.system_identifier', true), '')::bigint;
BEGIN
    IF l_id IS NULL THEN
        SELECT system_identifier INTO l_id FROM pg_control_system();
        PERFORM set_config('fencegate.system_identifier', l_id::text, false);
    END IF;
    RETURN l_id;
END
$$;
-- +goose StatementEnd

-- fencegate_timeline_id is the timeline the server writes WAL on now. Not
-- pg_control_checkpoint().timeline_id: that is the last checkpoint's, and
-- after a promotion the first checkpoint on the new timeline is spread over
-- checkpoint_completion_target × checkpoint_timeout (minutes) when many
-- buffers are dirty, and for all that time it still names the old timeline
-- (checked on PostgreSQL 15). The name of the current WAL file starts with
-- the insertion timeline in 8 hex digits, and that changes at the promotion
-- itself. It fails on a standby (recovery in progress), where no grant
-- runs.
-- +goose StatementBegin
CREATE FUNCTION fencegate_timeline_id() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
$$;
-- +goose StatementEnd

INSERT INTO epoch_authority (system_identifier, timeline_id)
SELECT fencegate_system_identifier(), fencegate_timeline_id();

-- fencegate_epoch_authority checks that this database is the epoch
-- authority on record and returns the epoch new resources start from.
-- Called by every grant (lease.Issuer.Acquire, Advance) in the statement
-- that creates the resource's control row, before the statement that locks
-- and reads it (see lease.lockResource), so the grant always reads an epoch
-- that is already raised when a jump was due.
-- +goose StatementBegin
CREATE FUNCTION fencegate_epoch_authority(p_jump bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    l_sysid bigint := fencegate_system_identifier();
    l_tli   bigint := fencegate_timeline_id();
    l_max   constant bigint := 9007199254740992; -- lease.MaxEpoch, 2^53
    a       epoch_authority%ROWTYPE;
    l_jump  bigint := greatest(coalesce(p_jump, 0), 0);
    l_floor bigint;
BEGIN
    -- The fast path, every grant: a plain read of one row, no lock.
    SELECT * INTO a FROM epoch_authority;
    IF FOUND AND a.system_identifier = l_sysid AND a.timeline_id = l_tli THEN
        RETURN a.epoch_floor;
    END IF;

    -- Something differs. The table lock (SHARE ROW EXCLUSIVE conflicts with
    -- itself, not with the fast path's reads) makes the grants that see it
    -- at once take turns: the first one decides and jumps; the others wait
    -- for it to commit, and their read below, a new statement with a new
    -- snapshot (READ COMMITTED), sees its row, so the jump happens once.
    -- (Had the first one rolled back, the next one sees the old row and
    -- does it itself.) Taken before any control-row lock of this grant:
    -- this is the grant's first statement.
    LOCK TABLE epoch_authority IN SHARE ROW EXCLUSIVE MODE;
    SELECT * INTO a FROM epoch_authority;
    IF FOUND THEN
        IF a.system_identifier = l_sysid AND a.timeline_id = l_tli THEN
            RETURN a.epoch_floor;
        END IF;
        -- Refused, nothing changed: epochs granted by the database of
        -- record may be missing here, and nothing here tells how many.
        IF a.system_identifier <> l_sysid THEN
            RAISE EXCEPTION 'epoch authority changed: the database''s system identifier is %, but epochs were granted by a database with system identifier %',
                l_sysid, a.system_identifier
                USING ERRCODE = 'ZF001',
                      HINT = 'a different database or a copy of it (restore, pg_upgrade); see docs/guarantees.md, "After a failover"';
        END IF;
        IF l_tli < a.timeline_id THEN
            RAISE EXCEPTION 'epoch authority changed: the database''s timeline went backwards, from % to %',
                a.timeline_id, l_tli
                USING ERRCODE = 'ZF001',
                      HINT = 'a restore from an older backup; see docs/guarantees.md, "After a failover"';
        END IF;
    END IF;

    -- A promotion (a higher timeline) or an unknown history (no row).
    l_floor := least(coalesce(a.epoch_floor, 0) + l_jump, l_max);
    IF l_jump > 0 THEN
        -- Lock every control row first, in resource id order (byte order),
        -- the order fencegate_enqueue_batch locks them in, so this cannot
        -- deadlock with a batch enqueue; a single-resource grant or enqueue
        -- holds one row and waits for nothing we hold. Waits are bounded by
        -- the grant's lock_timeout (lease.ErrBusy: nothing changed, retry).
        PERFORM 1 FROM resources ORDER BY resource_id COLLATE "C" FOR UPDATE;
        -- Then one statement raises and records. It takes a new snapshot
        -- after every lock above was granted, so it reads each row's
        -- latest committed epoch (an enqueue or renewal that committed
        -- while we waited is not missed), and nothing can change them
        -- until this grant commits. A resource at the ceiling keeps it: it
        -- is exhausted, and no grant goes past 2^53.
        WITH old AS (
            SELECT resource_id, epoch, holder, renewed_at FROM resources WHERE epoch < l_max
        ), up AS (
            UPDATE resources r
            SET epoch = least(old.epoch + l_jump, l_max), holder = NULL, lease_expires_at = NULL, updated_at = now()
            FROM old WHERE r.resource_id = old.resource_id
            RETURNING r.resource_id, r.epoch, old.epoch AS previous_epoch, old.holder AS previous_holder,
                      CASE WHEN old.holder IS NOT NULL THEN now() - old.renewed_at END AS since
        )
        INSERT INTO epoch_grants (resource_id, epoch, holder, how, previous_epoch, previous_holder, since_previous_renewal)
        SELECT resource_id, epoch, NULL, 'failover', previous_epoch, previous_holder, since FROM up;
    END IF;
    -- Recorded in the same transaction as the raised epochs: both commit
    -- with the grant, or neither does and the next grant jumps instead.
    DELETE FROM epoch_authority;
    INSERT INTO epoch_authority (system_identifier, timeline_id, epoch_floor, last_jump)
    VALUES (l_sysid, l_tli, l_floor, l_jump);
    RETURN l_floor;
END
$$;
-- +goose StatementEnd

ALTER TABLE epoch_grants DROP CONSTRAINT epoch_grants_how_check;
ALTER TABLE epoch_grants ADD CONSTRAINT epoch_grants_how_check
    CHECK (how IN ('free', 'after_expiry', 'released', 'reacquired', 'external_advance', 'failover'));

-- +goose Down
DROP FUNCTION fencegate_epoch_authority(bigint);
DROP FUNCTION fencegate_timeline_id();
DROP FUNCTION fencegate_system_identifier();
DROP TABLE epoch_authority;
ALTER TABLE epoch_grants DROP CONSTRAINT epoch_grants_how_check;
-- NOT VALID: rows recorded as 'failover' stay (they are real raises).
ALTER TABLE epoch_grants ADD CONSTRAINT epoch_grants_how_check
    CHECK (how IN ('free', 'after_expiry', 'released', 'reacquired', 'external_advance')) NOT VALID;
