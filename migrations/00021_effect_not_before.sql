-- +goose Up

-- effect: whether an intent's effect may have happened at its destination,
-- kept across retries, resolves and sweeps, so that no status and no
-- operator action contradicts it.
--   none     no attempt of the intent can have reached the destination (or
--            a lookup proved, after the settle window, that none did);
--   possible an attempt's outcome was lost (unknown), an abandoned attempt
--            was taken over, or the intent is unknown: it may have happened;
--   done     the effect happened (succeeded, found by a lookup, resolved
--            succeeded by an operator).
-- An intent whose effect is possible never ends failed: when its attempts
-- run out it ends unknown, held for an operator.
--
-- not_before: a deferred retry (a destination's Retry-After, the runtime's
-- backoff) is not relayed again, nor executed, before this moment.
ALTER TABLE intents ADD COLUMN effect text NOT NULL DEFAULT 'none';
ALTER TABLE intents ADD COLUMN not_before timestamptz;
ALTER TABLE intents ADD CONSTRAINT intents_effect_check CHECK (effect IN ('none', 'possible', 'done')) NOT VALID;
UPDATE intents SET effect = 'done' WHERE status = 'succeeded';
UPDATE intents SET effect = 'possible' WHERE status = 'unknown';
ALTER TABLE intents VALIDATE CONSTRAINT intents_effect_check;

-- +goose Down
ALTER TABLE intents DROP COLUMN not_before;
ALTER TABLE intents DROP COLUMN effect;
