-- The inbox: one row per (handler, message id) claimed. The primary key is
-- what turns a second delivery into a no-op; received_at is set by the
-- database clock (UTC, millisecond precision) and drives retention.
CREATE TABLE IF NOT EXISTS inbox_messages (
    handler     TEXT NOT NULL CHECK (length(CAST(handler AS BLOB)) BETWEEN 1 AND 255),
    message_id  TEXT NOT NULL CHECK (length(CAST(message_id AS BLOB)) BETWEEN 1 AND 255),
    received_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (handler, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_messages_received_at_idx ON inbox_messages (received_at);
