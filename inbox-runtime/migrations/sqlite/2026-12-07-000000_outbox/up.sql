-- The outbox: messages a transaction sends, recorded in that transaction and
-- published by a relay after it committed (`inbox_runtime::outbox`). A new
-- table: existing inboxes keep working. Safe to run again (this file is also
-- part of `inbox_runtime::setup()`).
--
-- position orders the relay's scan; id is the message's own id (time-ordered,
-- sent as the broker's message id). Messages with the same ordering_key get
-- key_seq 1, 2, 3 and so on in commit order (inbox_outbox_keys holds each key's last
-- number), and the relay publishes a key's message only when every earlier
-- one is sent. Times are UTC text with millisecond precision, as in
-- inbox_messages; the length checks count UTF-8 bytes whatever the database
-- encoding (see the 2026-12-03 migration).
CREATE TABLE IF NOT EXISTS inbox_outbox (
    position     INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT    NOT NULL UNIQUE CHECK (length(CAST(id AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    destination  TEXT    NOT NULL CHECK (length(CAST(destination AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    ordering_key TEXT    NULL CHECK (length(CAST(ordering_key AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    key_seq      INTEGER NULL,
    headers      BLOB    NOT NULL,
    payload      BLOB    NOT NULL,
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT    NULL,
    retry_at     TEXT    NULL,
    lease_owner  TEXT    NULL,
    leased_until TEXT    NULL,
    sent_at      TEXT    NULL,
    dead_at      TEXT    NULL,
    CHECK ((ordering_key IS NULL) = (key_seq IS NULL)),
    UNIQUE (ordering_key, key_seq)
);
CREATE INDEX IF NOT EXISTS inbox_outbox_sent_at_idx ON inbox_outbox (sent_at, position);
CREATE INDEX IF NOT EXISTS inbox_outbox_key_unsent_idx ON inbox_outbox (ordering_key, sent_at, key_seq);
CREATE TABLE IF NOT EXISTS inbox_outbox_keys (
    ordering_key TEXT    PRIMARY KEY CHECK (length(CAST(ordering_key AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    last_seq     INTEGER NOT NULL
) WITHOUT ROWID;
