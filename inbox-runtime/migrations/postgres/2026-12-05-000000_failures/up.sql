-- Failed attempts and dead messages, one row per (handler, message id) that
-- failed at least once. Written after the failed attempt's transaction
-- rolled back, in a short transaction of its own, so the count survives the
-- rollback. A row with dead_at set is a dead message: its id was claimed in
-- inbox_messages in the same transaction, so later deliveries are
-- duplicates. A new table: existing inboxes keep working, and a message that
-- never fails never touches it. Safe to run again (this file is also part of
-- `inbox_runtime::setup()`).
CREATE TABLE IF NOT EXISTS inbox_failures (
    handler         TEXT        NOT NULL CHECK (octet_length(handler) BETWEEN 1 AND 255),
    message_id      TEXT        NOT NULL CHECK (octet_length(message_id) BETWEEN 1 AND 255),
    attempts        INTEGER     NOT NULL CHECK (attempts >= 1),
    last_error      TEXT        NOT NULL,
    first_failed_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
    last_failed_at  TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
    dead_at         TIMESTAMPTZ NULL,
    rejected        BOOLEAN     NOT NULL DEFAULT FALSE,
    PRIMARY KEY (handler, message_id)
);
-- Pruning walks last_failed_at (all handlers, or one handler's rows); the
-- operator surface lists a handler's dead messages oldest first.
CREATE INDEX IF NOT EXISTS inbox_failures_last_failed_at_idx ON inbox_failures (last_failed_at);
CREATE INDEX IF NOT EXISTS inbox_failures_handler_last_failed_at_idx ON inbox_failures (handler, last_failed_at);
CREATE INDEX IF NOT EXISTS inbox_failures_dead_idx ON inbox_failures (handler, dead_at) WHERE dead_at IS NOT NULL;
