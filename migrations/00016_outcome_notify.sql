-- +goose Up

-- Issue 17 (waiting for an outcome). outbox.Client.Wait and the admin API's
-- GET /api/v1/intents/{id}?wait= answer when an intent reaches a final
-- status, woken by a notification instead of polling per waiter. Every
-- path that gives an intent a final status (adapters, group commit, the
-- dispatcher's supersede, operators, SQL by hand) updates intents.status,
-- so one trigger covers them all.
--
-- A row trigger, but cheap where it matters: its WHEN clause is evaluated
-- without calling the function for every other update (relay marks,
-- attempt counts), and the payload is empty, so PostgreSQL folds the
-- notifications of one transaction into one (identical notifications are
-- sent once): a group commit of hundreds of outcomes sends one. Waiters
-- then re-read the intents they wait for.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencegate_notify_outcome() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fencegate_outcomes', '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER IF EXISTS intents_outcome_notify ON intents;
CREATE TRIGGER intents_outcome_notify
    AFTER UPDATE OF status ON intents
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed', 'superseded', 'unknown', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION fencegate_notify_outcome();

-- +goose Down
DROP TRIGGER IF EXISTS intents_outcome_notify ON intents;
DROP FUNCTION IF EXISTS fencegate_notify_outcome();
