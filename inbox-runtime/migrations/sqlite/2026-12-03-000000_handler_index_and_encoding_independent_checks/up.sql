-- Rebuilds the inbox of 2026-12-01 with two changes (SQLite cannot alter a
-- CHECK constraint, so this is its documented procedure for other schema
-- changes: create the new table, copy, drop the old one, rename; in the
-- migration's transaction, all or nothing).
--
-- 1. The length checks count UTF-8 bytes whatever the database encoding.
--    CAST(x AS BLOB) yields the text in the database's encoding, so the old
--    check counted UTF-16 bytes in a database created with
--    PRAGMA encoding = 'UTF-16le' (or 'UTF-16be'), and refused valid ids: 255
--    ASCII characters are 510 bytes there. length(CAST('x' AS BLOB)) is the
--    size of an ASCII character in the database's encoding: 1 in UTF-8, where
--    the check is exactly 1 to 255 bytes as before, and 2 in UTF-16, where an
--    id of at most 255 UTF-8 bytes takes at most 510 bytes. The runtime checks
--    the exact UTF-8 length before every claim; this is the backstop.
-- 2. An index on (handler, received_at): pruning one handler's rows walks it
--    (the handler's expired rows, oldest first, and no other row).
--
-- Triggers on inbox_messages are dropped with the old table: recreate yours
-- afterwards. Views and triggers elsewhere that name inbox_messages keep
-- working (legacy_alter_table, on for the rename and back to its default,
-- off, after it, keeps the rename from checking them while the name is
-- briefly free). A foreign key that references inbox_messages makes the DROP
-- fail when foreign keys are enforced.
CREATE TABLE inbox_messages_new (
    handler     TEXT NOT NULL CHECK (length(CAST(handler AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    message_id  TEXT NOT NULL CHECK (length(CAST(message_id AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    received_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    PRIMARY KEY (handler, message_id)
) WITHOUT ROWID;
INSERT INTO inbox_messages_new (handler, message_id, received_at)
    SELECT handler, message_id, received_at FROM inbox_messages;
DROP TABLE inbox_messages;
PRAGMA legacy_alter_table = ON;
ALTER TABLE inbox_messages_new RENAME TO inbox_messages;
PRAGMA legacy_alter_table = OFF;
CREATE INDEX inbox_messages_received_at_idx ON inbox_messages (received_at);
CREATE INDEX inbox_messages_handler_received_at_idx ON inbox_messages (handler, received_at);
