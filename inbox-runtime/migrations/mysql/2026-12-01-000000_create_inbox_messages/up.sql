-- The inbox: one row per (handler, message id) claimed. The primary key is
-- what turns a second delivery into a no-op; received_at is set by the
-- database clock (UTC) and drives retention. Ids are stored as bytes so that
-- comparison is exact: no case folding and no trailing-space padding, which a
-- text collation would apply and which would merge distinct ids.
CREATE TABLE IF NOT EXISTS inbox_messages (
    handler     VARBINARY(255) NOT NULL,
    message_id  VARBINARY(255) NOT NULL,
    received_at DATETIME(6)    NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (handler, message_id),
    KEY inbox_messages_received_at_idx (received_at),
    CONSTRAINT inbox_messages_handler_not_empty CHECK (LENGTH(handler) > 0),
    CONSTRAINT inbox_messages_message_id_not_empty CHECK (LENGTH(message_id) > 0)
) ENGINE = InnoDB;
