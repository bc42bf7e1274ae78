-- Back to the plain layout. Every archived id returns to inbox_messages first,
-- so no id is forgotten (this copies the whole archive: plan for its size).
DROP TRIGGER IF EXISTS inbox_messages_claim_guard ON inbox_messages;
INSERT INTO inbox_messages (handler, message_id, received_at)
    SELECT handler, message_id, received_at FROM inbox_messages_archive
    ON CONFLICT (handler, message_id) DO NOTHING;
DROP TABLE IF EXISTS inbox_messages_archive;
DO $$
DECLARE
    leftover REGCLASS;
    primary_key TEXT;
    received_index REGCLASS;
BEGIN
    -- Generations detached by an interrupted prune.
    FOR leftover IN
        SELECT c.oid::regclass FROM pg_class c
        WHERE c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'inbox_messages'::regclass)
          AND c.relkind = 'r' AND c.relname ~ '^inbox_messages_g[0-9]+$'
    LOOP
        EXECUTE format('DROP TABLE %s', leftover);
    END LOOP;
    -- The plain layout's names.
    SELECT conname INTO primary_key FROM pg_constraint
        WHERE conrelid = 'inbox_messages'::regclass AND contype = 'p';
    IF primary_key IS DISTINCT FROM 'inbox_messages_pkey' THEN
        EXECUTE format('ALTER TABLE inbox_messages RENAME CONSTRAINT %I TO inbox_messages_pkey', primary_key);
    END IF;
    -- The index on received_at alone (the table may have others, such as
    -- the one on (handler, received_at) of 2026-12-03).
    SELECT indexrelid::regclass INTO received_index FROM pg_index
        WHERE indrelid = 'inbox_messages'::regclass AND NOT indisprimary
          AND indnatts = 1
          AND indkey[0] = (SELECT attnum FROM pg_attribute
                           WHERE attrelid = 'inbox_messages'::regclass AND attname = 'received_at')
        LIMIT 1;
    IF received_index IS NOT NULL AND received_index::text <> 'inbox_messages_received_at_idx' THEN
        EXECUTE format('ALTER INDEX %s RENAME TO inbox_messages_received_at_idx', received_index);
    END IF;
END
$$;
ALTER TABLE inbox_messages DROP COLUMN IF EXISTS generation;
DROP TABLE IF EXISTS inbox_generations;
DROP FUNCTION IF EXISTS inbox_rotate(INTERVAL);
DROP FUNCTION IF EXISTS inbox_create_generation_table(TEXT, BIGINT);
DROP FUNCTION IF EXISTS inbox_claim_guard();
