-- +goose Up

-- intent_events is the history of what operators (and, later, other
-- components) did to an intent: one row per action, written in the same
-- transaction as the status change it records, so the history never claims a
-- change that did not commit, nor misses one that did.
CREATE TABLE intent_events (
    event_id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Cascade: an intent deleted by a retention job takes its history along.
    intent_id   bigint      NOT NULL REFERENCES intents (intent_id) ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT now(),
    -- actor is the name of the API token used, or 'anonymous' when the
    -- server runs without tokens (loopback only).
    actor       text        NOT NULL CHECK (octet_length(actor) BETWEEN 1 AND 200),
    action      text        NOT NULL CHECK (octet_length(action) BETWEEN 1 AND 64),
    from_status text        NOT NULL,
    to_status   text        NOT NULL,
    note        text        CHECK (octet_length(note) <= 4096),
    -- last_error is the intent's last_error when the action was taken: a
    -- retry clears it on the intent, and it is kept here.
    last_error  text
);

-- An intent's history in order.
CREATE INDEX intent_events_intent_idx ON intent_events (intent_id, event_id);

-- +goose Down
DROP TABLE intent_events;
