-- +goose Up

-- last_io_at bounds the I/O with the destination of every attempt that has
-- owned the key since it was created (issue 11, item 4: a lookup that finds
-- nothing is not proof). A destination may take an effect long after the
-- attempt stopped talking to it (a relay that stores a message minutes after
-- the final dot), so a lookup that finds nothing proves the effect did not
-- happen only once a settle window has passed since the last moment any
-- attempt could have done I/O with the destination. The window is the
-- adapter runtime's setting (per kind); the moment is recorded here, so that
-- it survives a crash of the runtime that measured it.
--
-- NULL: the owning attempt may be doing I/O right now (it is executing), or
-- the last I/O is unknown. A takeover of an abandoned attempt sets it to the
-- takeover time when it is NULL: the abandoned attempt could have done I/O
-- until then, never after (its owner check before the irrevocable step fails
-- once its token is replaced). Set: no attempt under this key does I/O any
-- more unless it clears the column first, under its token; a takeover keeps
-- it.
ALTER TABLE idempotency_keys ADD COLUMN last_io_at timestamptz;

-- +goose Down
ALTER TABLE idempotency_keys DROP COLUMN last_io_at;
