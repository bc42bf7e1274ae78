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
    CHECK ((ordering_key IS NULL) = (key_seq IS NULL))
);
-- Every index below but the id's is partial, so that a message without an
-- ordering key, as written, enters two indexes (the id and the pending one)
-- and no more: a commit writes every page it changed to the WAL, and each
-- index an insert enters is another page.
--
-- A key's numbers, each given once.
CREATE UNIQUE INDEX IF NOT EXISTS inbox_outbox_key_seq_unique ON inbox_outbox (ordering_key, key_seq)
    WHERE ordering_key IS NOT NULL;
-- The relay's lease: the pending messages in position order.
CREATE INDEX IF NOT EXISTS inbox_outbox_pending_idx ON inbox_outbox (position)
    WHERE sent_at IS NULL AND dead_at IS NULL;
-- The dead messages in position order: the operator's list, revive and
-- discard, and the backlog's count of them.
CREATE INDEX IF NOT EXISTS inbox_outbox_dead_idx ON inbox_outbox (position)
    WHERE dead_at IS NOT NULL AND sent_at IS NULL;
-- Pruning: the messages kept after they were sent (`Relay::keep_sent`), oldest first.
CREATE INDEX IF NOT EXISTS inbox_outbox_sent_at_idx ON inbox_outbox (sent_at, position)
    WHERE sent_at IS NOT NULL;
-- A key's earlier unsent messages (the order check).
CREATE INDEX IF NOT EXISTS inbox_outbox_key_unsent_idx ON inbox_outbox (ordering_key, key_seq)
    WHERE ordering_key IS NOT NULL AND sent_at IS NULL;
CREATE TABLE IF NOT EXISTS inbox_outbox_keys (
    ordering_key TEXT    PRIMARY KEY CHECK (length(CAST(ordering_key AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    last_seq     INTEGER NOT NULL
) WITHOUT ROWID;
