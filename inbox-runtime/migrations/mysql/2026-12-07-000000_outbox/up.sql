-- The outbox: messages a transaction sends, recorded in that transaction and
-- published by a relay after it committed (`inbox_runtime::outbox`). A new
-- table: existing inboxes keep working. Safe to run again (this file is also
-- part of `inbox_runtime::setup()`).
--
-- position orders the relay's scan; id is the message's own id (time-ordered,
-- sent as the broker's message id). Messages with the same ordering_key get
-- key_seq 1, 2, 3 and so on in commit order (inbox_outbox_keys holds each key's last
-- number; writers of one key take turns on its row until they commit), and
-- the relay publishes a key's message only when every earlier one is sent.
-- Texts that are compared are bytes, as in inbox_messages; times are UTC.
CREATE TABLE IF NOT EXISTS inbox_outbox (
    position     BIGINT          NOT NULL AUTO_INCREMENT,
    id           VARBINARY(255)  NOT NULL,
    destination  VARBINARY(255)  NOT NULL,
    ordering_key VARBINARY(255)  NULL,
    key_seq      BIGINT          NULL,
    headers      LONGBLOB        NOT NULL,
    payload      LONGBLOB        NOT NULL,
    created_at   DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    attempts     INT             NOT NULL DEFAULT 0,
    last_error   VARBINARY(1024) NULL,
    retry_at     DATETIME(6)     NULL,
    lease_owner  VARBINARY(64)   NULL,
    leased_until DATETIME(6)     NULL,
    sent_at      DATETIME(6)     NULL,
    dead_at      DATETIME(6)     NULL,
    PRIMARY KEY (position),
    UNIQUE KEY inbox_outbox_id (id),
    UNIQUE KEY inbox_outbox_key_seq_unique (ordering_key, key_seq),
    KEY inbox_outbox_sent_at_idx (sent_at, position),
    KEY inbox_outbox_key_unsent_idx (ordering_key, sent_at, key_seq),
    CONSTRAINT inbox_outbox_id_not_empty CHECK (LENGTH(id) > 0),
    CONSTRAINT inbox_outbox_destination_not_empty CHECK (LENGTH(destination) > 0),
    CONSTRAINT inbox_outbox_key_not_empty CHECK (ordering_key IS NULL OR LENGTH(ordering_key) > 0),
    CONSTRAINT inbox_outbox_key_and_seq CHECK ((ordering_key IS NULL) = (key_seq IS NULL))
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS inbox_outbox_keys (
    ordering_key VARBINARY(255) NOT NULL,
    last_seq     BIGINT         NOT NULL,
    PRIMARY KEY (ordering_key)
) ENGINE = InnoDB;
