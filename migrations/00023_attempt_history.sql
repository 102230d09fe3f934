-- +goose Up

-- intent_attempts: one row per attempt of an intent (an attempt is what
-- intents.attempts counts: an execution, or the takeover of an abandoned
-- one), written in the transaction that records how the attempt ended,
-- so the history never shows an end that did not commit. An attempt that
-- never ended (its process died) is written by the attempt that takes its
-- key over, as abandoned.
--   started_at   when the attempt was counted (PostgreSQL's clock, less
--                the attempt's duration as its process measured it);
--                NULL for an abandoned attempt;
--   process      the adapter process that ran it;
--   outcome      succeeded, failed, unknown, superseded (the intent's
--                status it recorded), retry (deferred, key given back),
--                retry_key_kept (deferred, key kept: the effect may have
--                happened), waiting_for_proof, lookup_failed, lost_key
--                (its key was taken over), abandoned;
--   error_class  retryable, permanent, unknown or unclassified;
--   lookup       found, not_found or error: what a lookup at the
--                destination found, when the attempt looked one up;
--   retry_after  the destination's Retry-After;
--   not_before   when the next attempt was due (the intent's not_before);
--   key_token    the idempotency key's token the attempt held.
-- No foreign key: its check is one query per inserted row (PostgreSQL's
-- referential-integrity trigger), about a third of the cost of recording an
-- attempt in a drain (pg_stat_statements). Every row is written in a
-- transaction that has just locked or updated its intent, and the
-- sweeper deletes an intent's attempts in the statement that deletes the
-- intent (internal/intents.SweepSQL).
CREATE TABLE intent_attempts (
    intent_id   bigint      NOT NULL,
    attempt     integer     NOT NULL CHECK (attempt >= 1),
    started_at  timestamptz,
    ended_at    timestamptz NOT NULL,
    process     text        CHECK (octet_length(process) <= 200),
    outcome     text        NOT NULL CHECK (octet_length(outcome) BETWEEN 1 AND 64),
    error_class text        CHECK (error_class IN ('retryable', 'permanent', 'unknown', 'unclassified')),
    error       text        CHECK (octet_length(error) <= 4096),
    lookup      text        CHECK (lookup IN ('found', 'not_found', 'error')),
    retry_after interval,
    not_before  timestamptz,
    key_token   bigint,
    PRIMARY KEY (intent_id, attempt)
);

-- +goose Down
DROP TABLE intent_attempts;
