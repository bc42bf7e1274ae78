-- The SQLite inbox as its migrations leave it (2026-12-01, rebuilt by
-- 2026-12-03, two columns added by 2026-12-06): what `inbox_runtime::setup()`
-- creates. Safe to run again. A table created by an earlier version is left
-- as it is here; setup() then rebuilds it with the 2026-12-03 migration if it
-- needs that, and adds the 2026-12-06 columns if it lacks them.
--
-- fingerprint and result sit on received_at's line as SQLite writes them
-- when the 2026-12-06 migration's ALTER TABLE adds them: an inbox made here
-- and one made by the migrations then have the same definition text.
--
-- received_at is UTC text with millisecond precision, by the database clock.
-- The length checks count UTF-8 bytes whatever the database encoding:
-- length(CAST('x' AS BLOB)) is the size of an ASCII character in the
-- database's encoding (1 in UTF-8, 2 in UTF-16; see the 2026-12-03 migration).
CREATE TABLE IF NOT EXISTS inbox_messages (
    handler     TEXT NOT NULL CHECK (length(CAST(handler AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    message_id  TEXT NOT NULL CHECK (length(CAST(message_id AS BLOB)) BETWEEN 1 AND 255 * length(CAST('x' AS BLOB))),
    received_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')), fingerprint BLOB NULL, result BLOB NULL,
    PRIMARY KEY (handler, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_messages_received_at_idx ON inbox_messages (received_at);
CREATE INDEX IF NOT EXISTS inbox_messages_handler_received_at_idx ON inbox_messages (handler, received_at);
