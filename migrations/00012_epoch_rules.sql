-- +goose Up

-- Issue 11, "the guarantee, hardened".
--
-- 1. Every grant is a new fencing token: an Acquire by the holder that
--    already holds a live lease now gets a new epoch too (lease.HowReacquired),
--    so that grant is recorded in epoch_grants like any other. The comment
--    of 00004_epoch_history.sql ("a same-holder re-acquire keeps the epoch
--    and is not recorded") no longer holds.
ALTER TABLE epoch_grants DROP CONSTRAINT epoch_grants_how_check;
ALTER TABLE epoch_grants ADD CONSTRAINT epoch_grants_how_check
    CHECK (how IN ('free', 'after_expiry', 'released', 'reacquired', 'external_advance'));

-- 2. Epochs are at most 2^53 (lease.MaxEpoch), the largest integer every
--    JSON client reads exactly. The issuer refuses larger epochs as bad
--    input and refuses to grant past the ceiling; this constraint is the
--    safety net under that code, whatever writes the row. NOT VALID: it
--    holds for every row written from now on without rejecting this
--    migration on a database that already has a larger epoch (such a
--    resource is exhausted: nothing can lower its epoch, nor raise it).
ALTER TABLE resources ADD CONSTRAINT resources_epoch_max_check
    CHECK (epoch <= 9007199254740992) NOT VALID;

-- +goose Down
ALTER TABLE resources DROP CONSTRAINT resources_epoch_max_check;
ALTER TABLE epoch_grants DROP CONSTRAINT epoch_grants_how_check;
-- NOT VALID: rows recorded as 'reacquired' stay (they are real grants).
ALTER TABLE epoch_grants ADD CONSTRAINT epoch_grants_how_check
    CHECK (how IN ('free', 'after_expiry', 'released', 'external_advance')) NOT VALID;
