-- Failed attempts and dead messages, one row per (handler, message id) that
-- failed at least once. Written after the failed attempt's transaction
-- rolled back, in a short transaction of its own, so the count survives the
-- rollback. A row with dead_at set is a dead message: its id was claimed in
-- inbox_messages in the same transaction, so later deliveries are
-- duplicates. A new table: existing inboxes keep working, and a message that
-- never fails never touches it. Safe to run again (this file is also part of
-- `inbox_runtime::setup()`). Times are UTC text with millisecond precision,
-- as in inbox_messages; the length checks count UTF-8 bytes whatever the
-- database encoding (see the 2026-12-03 migration).
CREATE TABLE IF NOT EXISTS inbox_failures (
    handler         TEXT    NOT NULL CHECK (length(CAST(handler AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    message_id      TEXT    NOT NULL CHECK (length(CAST(message_id AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    attempts        INTEGER NOT NULL CHECK (attempts >= 1),
    last_error      TEXT    NOT NULL,
    first_failed_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    last_failed_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    dead_at         TEXT    NULL,
    rejected        BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (handler, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_failures_last_failed_at_idx ON inbox_failures (last_failed_at);
CREATE INDEX IF NOT EXISTS inbox_failures_handler_last_failed_at_idx ON inbox_failures (handler, last_failed_at);
CREATE INDEX IF NOT EXISTS inbox_failures_dead_idx ON inbox_failures (handler, dead_at) WHERE dead_at IS NOT NULL;
