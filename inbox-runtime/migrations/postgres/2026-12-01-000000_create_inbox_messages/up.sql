-- The inbox: one row per (handler, message id) claimed. The primary key is
-- what turns a second delivery into a no-op; received_at is set by the
-- database clock and drives retention.
CREATE TABLE IF NOT EXISTS inbox_messages (
    handler     TEXT        NOT NULL CHECK (octet_length(handler) BETWEEN 1 AND 255),
    message_id  TEXT        NOT NULL CHECK (octet_length(message_id) BETWEEN 1 AND 255),
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (handler, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_messages_received_at_idx ON inbox_messages (received_at);
