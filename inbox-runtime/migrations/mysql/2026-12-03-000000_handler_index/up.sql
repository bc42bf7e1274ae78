-- An index on (handler, received_at), safe to run again (this file is also
-- part of `inbox_runtime::setup()`). Pruning one handler's rows (a handler
-- with a window of its own, `only(..)`, and every handler in turn when some
-- are excluded from the default window) walks it: the handler's expired
-- rows, oldest first, and no other row. Without it a batch walks received_at
-- across all handlers and locks every other handler's row it passes.
-- MySQL has no CREATE INDEX IF NOT EXISTS, hence the prepared statement.
-- InnoDB builds the index online: claims go on while it builds.
SET @inbox_messages_ddl = IF(
    EXISTS (SELECT 1 FROM information_schema.statistics
            WHERE table_schema = DATABASE() AND table_name = 'inbox_messages'
              AND index_name = 'inbox_messages_handler_received_at_idx'),
    'DO 0',
    'CREATE INDEX inbox_messages_handler_received_at_idx ON inbox_messages (handler, received_at)');
PREPARE inbox_messages_ddl FROM @inbox_messages_ddl;
EXECUTE inbox_messages_ddl;
DEALLOCATE PREPARE inbox_messages_ddl;
