-- Two changes to the inbox of 2026-12-01, both safe to run again (this file
-- is also part of `inbox_runtime::setup()`), and neither takes a lock when
-- there is nothing to change.
--
-- 1. An index on (handler, received_at), received_at taken as UTC time.
--    Pruning one handler's rows (a handler with a window of its own,
--    `only(..)`, and every handler in turn when some are excluded from the
--    default window) walks it: the handler's expired rows, oldest first, and
--    no other row. Its batches compare and order by
--    (received_at AT TIME ZONE 'UTC'), the same instants as received_at, an
--    expression the index on received_at alone cannot serve: PostgreSQL has
--    no index hints, and its planner would otherwise sometimes walk that
--    index (whose order is the table's) and read every other handler's row
--    on the way, filtering them out.
--    CREATE INDEX blocks writes to the table while it builds. On a large
--    inbox, build it first without blocking claims, then run this:
--      CREATE INDEX CONCURRENTLY inbox_messages_handler_received_at_idx
--          ON inbox_messages (handler, (received_at AT TIME ZONE 'UTC'));
-- 2. received_at defaults to statement_timestamp(), the start of the claim's
--    statement, instead of now(), the start of its transaction: a claim made
--    late in a long transaction of the caller's would otherwise be dated
--    back to its beginning and pruned that much earlier.
DO $$
DECLARE
    valid BOOLEAN;
    received_default TEXT;
BEGIN
    SELECT x.indisvalid INTO valid
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        WHERE x.indrelid = 'inbox_messages'::regclass
          AND i.relname = 'inbox_messages_handler_received_at_idx';
    IF valid IS NULL THEN
        CREATE INDEX inbox_messages_handler_received_at_idx
            ON inbox_messages (handler, (received_at AT TIME ZONE 'UTC'));
    ELSIF NOT valid THEN
        RAISE EXCEPTION 'inbox_messages_handler_received_at_idx is invalid (an interrupted CREATE INDEX CONCURRENTLY?)'
            USING HINT = 'DROP INDEX inbox_messages_handler_received_at_idx, then build it again';
    END IF;

    SELECT pg_get_expr(d.adbin, d.adrelid) INTO received_default
        FROM pg_attrdef d
        JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        WHERE d.adrelid = 'inbox_messages'::regclass AND a.attname = 'received_at';
    IF received_default IS DISTINCT FROM 'statement_timestamp()' THEN
        ALTER TABLE inbox_messages ALTER COLUMN received_at SET DEFAULT statement_timestamp();
    END IF;
END
$$;
