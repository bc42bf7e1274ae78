-- Failed attempts and dead messages, one row per (handler, message id) that
-- failed at least once. Written after the failed attempt's transaction
-- rolled back, in a short transaction of its own, so the count survives the
-- rollback. A row with dead_at set is a dead message: its id was claimed in
-- inbox_messages in the same transaction, so later deliveries are
-- duplicates. A new table: existing inboxes keep working, and a message that
-- never fails never touches it. Safe to run again (this file is also part of
-- `inbox_runtime::setup()`). Keys are bytes, as in inbox_messages; times are
-- UTC.
CREATE TABLE IF NOT EXISTS inbox_failures (
    handler         VARBINARY(255)  NOT NULL,
    message_id      VARBINARY(255)  NOT NULL,
    attempts        INT             NOT NULL,
    last_error      VARBINARY(1024) NOT NULL,
    first_failed_at DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    last_failed_at  DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    dead_at         DATETIME(6)     NULL,
    rejected        BOOLEAN         NOT NULL DEFAULT FALSE,
    PRIMARY KEY (handler, message_id),
    KEY inbox_failures_last_failed_at_idx (last_failed_at),
    KEY inbox_failures_handler_last_failed_at_idx (handler, last_failed_at),
    KEY inbox_failures_dead_idx (handler, dead_at),
    CONSTRAINT inbox_failures_handler_not_empty CHECK (LENGTH(handler) > 0),
    CONSTRAINT inbox_failures_message_id_not_empty CHECK (LENGTH(message_id) > 0),
    CONSTRAINT inbox_failures_attempts_positive CHECK (attempts >= 1)
) ENGINE = InnoDB;
