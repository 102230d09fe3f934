-- fencegate_notify_outcome: the trigger intents_outcome_notify (AFTER UPDATE
-- OF status ON intents, when an intent reaches a final status). Every path
-- that gives an intent a final status updates intents.status, so one
-- trigger wakes outbox.Client.Wait and the admin API's ?wait= for all of
-- them. The payload is empty, so PostgreSQL folds the notifications of one
-- transaction into one; waiters re-read the intents they wait for. The
-- channel is the schema's: <schema>_outcomes.
CREATE OR REPLACE FUNCTION fencegate.fencegate_notify_outcome() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_outcomes', '');
    RETURN NULL;
END
$$;
