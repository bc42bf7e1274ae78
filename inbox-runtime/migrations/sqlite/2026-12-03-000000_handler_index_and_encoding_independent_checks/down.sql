-- Back to the table of 2026-12-01 (its checks count bytes in the database's
-- encoding: in a UTF-16 database, rows with more than 255 such bytes make
-- the copy fail, and nothing changes).
CREATE TABLE inbox_messages_old (
    handler     TEXT NOT NULL CHECK (length(CAST(handler AS BLOB)) BETWEEN 1 AND 255),
    message_id  TEXT NOT NULL CHECK (length(CAST(message_id AS BLOB)) BETWEEN 1 AND 255),
    received_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (handler, message_id)
) WITHOUT ROWID;
INSERT INTO inbox_messages_old (handler, message_id, received_at)
    SELECT handler, message_id, received_at FROM inbox_messages;
DROP TABLE inbox_messages;
PRAGMA legacy_alter_table = ON;
ALTER TABLE inbox_messages_old RENAME TO inbox_messages;
PRAGMA legacy_alter_table = OFF;
CREATE INDEX inbox_messages_received_at_idx ON inbox_messages (received_at);
