-- The epochs: they never decrease, and the database that grants them is
-- the one on record (table epoch_authority): after a promotion every epoch
-- jumps once; a different database or an older timeline is refused with
-- ZF001 (lease.ErrAuthorityChanged). See docs/guarantees.md, "After a
-- failover".

-- fencegate_epoch_never_decreases: the trigger resources_epoch_never_decreases
-- (BEFORE UPDATE OF epoch ON resources). The epoch is the fencing token: it
-- only ever grows, enforced here on top of the code that writes it.
CREATE OR REPLACE FUNCTION fencegate.fencegate_epoch_never_decreases() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.epoch < OLD.epoch THEN
        RAISE EXCEPTION 'epoch of resource % would decrease from % to %',
            OLD.resource_id, OLD.epoch, NEW.epoch
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

-- fencegate_system_identifier is the cluster's system identifier, read
-- from the control file on every call. It is not cached in a session
-- setting: the SQL interface runs this check with its owner's rights, and
-- a worker's session can set any custom setting before it calls (a copy
-- of the database would then pass as the original, or a deleted record be
-- replaced by a false one that refuses every later grant). Reading the
-- file costs a few microseconds per grant (lease's BenchmarkAuthorityCheck).
CREATE OR REPLACE FUNCTION fencegate.fencegate_system_identifier() RETURNS bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT system_identifier FROM pg_control_system()
$$;

-- fencegate_timeline_id is the timeline the server writes WAL on now. Not
-- pg_control_checkpoint().timeline_id: that is the last checkpoint's, and
-- after a promotion the first checkpoint on the new timeline is spread over
-- checkpoint_completion_target × checkpoint_timeout (minutes) when many
-- buffers are dirty, and for all that time it still names the old timeline
-- (checked on PostgreSQL 15). The name of the current WAL file starts with
-- the insertion timeline in 8 hex digits, and that changes at the promotion
-- itself. It fails on a standby (recovery in progress), where no grant
-- runs.
CREATE OR REPLACE FUNCTION fencegate.fencegate_timeline_id() RETURNS bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
$$;

-- fencegate_epoch_authority checks that this database is the epoch
-- authority on record and returns the epoch new resources start from.
-- Called by every grant (lease.Issuer.Acquire, Advance) in the statement
-- that creates the resource's control row, before the statement that locks
-- and reads it (see lease.lockResource), so the grant always reads an epoch
-- that is already raised when a jump was due.
CREATE OR REPLACE FUNCTION fencegate.fencegate_epoch_authority(p_jump bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    l_sysid bigint := fencegate.fencegate_system_identifier();
    l_tli   bigint := fencegate.fencegate_timeline_id();
    l_max   constant bigint := 9007199254740992; -- lease.MaxEpoch, 2^53
    a       fencegate.epoch_authority%ROWTYPE;
    l_jump  bigint := greatest(coalesce(p_jump, 0), 0);
    l_floor bigint;
BEGIN
    -- The fast path, every grant: a plain read of one row, no lock.
    SELECT * INTO a FROM fencegate.epoch_authority;
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
    LOCK TABLE fencegate.epoch_authority IN SHARE ROW EXCLUSIVE MODE;
    SELECT * INTO a FROM fencegate.epoch_authority;
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
        PERFORM 1 FROM fencegate.resources ORDER BY resource_id COLLATE "C" FOR UPDATE;
        -- Then one statement raises and records. It takes a new snapshot
        -- after every lock above was granted, so it reads each row's
        -- latest committed epoch (an enqueue or renewal that committed
        -- while we waited is not missed), and nothing can change them
        -- until this grant commits. A resource at the ceiling keeps it: it
        -- is exhausted, and no grant goes past 2^53.
        WITH old AS (
            SELECT resource_id, epoch, holder, renewed_at FROM fencegate.resources WHERE epoch < l_max
        ), up AS (
            UPDATE fencegate.resources r
            SET epoch = least(old.epoch + l_jump, l_max), holder = NULL, lease_expires_at = NULL, updated_at = now()
            FROM old WHERE r.resource_id = old.resource_id
            RETURNING r.resource_id, r.epoch, old.epoch AS previous_epoch, old.holder AS previous_holder,
                      CASE WHEN old.holder IS NOT NULL THEN now() - old.renewed_at END AS since
        )
        INSERT INTO fencegate.epoch_grants (resource_id, epoch, holder, how, previous_epoch, previous_holder, since_previous_renewal)
        SELECT resource_id, epoch, NULL, 'failover', previous_epoch, previous_holder, since FROM up;
    END IF;
    -- Recorded in the same transaction as the raised epochs: both commit
    -- with the grant, or neither does and the next grant jumps instead.
    DELETE FROM fencegate.epoch_authority;
    INSERT INTO fencegate.epoch_authority (system_identifier, timeline_id, epoch_floor, last_jump)
    VALUES (l_sysid, l_tli, l_floor, l_jump);
    RETURN l_floor;
END
$$;
