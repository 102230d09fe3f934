-- +goose Up

-- A dispatcher's claim (claimed_by, claim_expires_at) and its release touch
-- no indexed column, so with free space in the page PostgreSQL updates the
-- row in place (a HOT update: no new entry in any of the table's indexes).
-- That halves the write cost of relaying an intent; the default fillfactor
-- of 100 leaves no room and makes every claim a full index update.
-- (Pages written before this migration keep their layout; new ones follow.)
ALTER TABLE intents SET (fillfactor = 70);

-- +goose Down
ALTER TABLE intents RESET (fillfactor);
