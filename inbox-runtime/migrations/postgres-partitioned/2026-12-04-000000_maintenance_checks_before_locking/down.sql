-- Back to the functions of 2026-12-02 (which lock the current table before
-- checking whether a rotation is due, and resolve names through the caller's
-- search_path). The index and default the up migration gave the current
-- table belong to the plain layout's 2026-12-03 migration and stay.

-- Fires before every insert into the current generation's table;
-- TG_ARGV[0] is that table's generation.
CREATE OR REPLACE FUNCTION inbox_claim_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM inbox_generations
                   WHERE generation = TG_ARGV[0]::bigint AND ended_at IS NULL) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'serialization_failure',
            MESSAGE = 'the inbox started a new generation after this transaction took its snapshot',
            HINT = 'retry the transaction';
    END IF;
    IF EXISTS (SELECT 1 FROM inbox_messages_archive AS archived
               WHERE archived.handler = NEW.handler AND archived.message_id = NEW.message_id) THEN
        RETURN NULL; -- claimed in an earlier generation: a duplicate
    END IF;
    RETURN NEW;
END
$$;

-- Creates the current generation's table in schema target_schema.
CREATE OR REPLACE FUNCTION inbox_create_generation_table(target_schema TEXT, new_generation BIGINT) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    prefix TEXT := 'inbox_messages_g' || new_generation;
BEGIN
    EXECUTE format(
        'CREATE TABLE %1$I.inbox_messages (
            handler     TEXT        NOT NULL CHECK (octet_length(handler) BETWEEN 1 AND 255),
            message_id  TEXT        NOT NULL CHECK (octet_length(message_id) BETWEEN 1 AND 255),
            received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            generation  BIGINT      NOT NULL DEFAULT %2$s,
            CONSTRAINT %3$I CHECK (generation >= %2$s AND generation < %4$s),
            CONSTRAINT %5$I PRIMARY KEY (handler, message_id)
        )',
        target_schema, new_generation, prefix || '_generation', new_generation + 1, prefix || '_pkey');
    -- The same name as in the plain layout (free again: rotation drops the
    -- archived table's copy first), so the plain setup finds it.
    EXECUTE format('CREATE INDEX inbox_messages_received_at_idx ON %I.inbox_messages (received_at)', target_schema);
    EXECUTE format(
        'CREATE TRIGGER inbox_messages_claim_guard BEFORE INSERT ON %I.inbox_messages
         FOR EACH ROW EXECUTE FUNCTION inbox_claim_guard(%L)',
        target_schema, new_generation::text);
END
$$;

-- Ends the current generation if it started at least min_age ago: the table
-- becomes a partition of the archive and an empty one takes its place.
-- Returns the new generation, or NULL when the current one is younger than
-- min_age. Waits for claims in progress (set lock_timeout to bound the wait:
-- new claims queue behind it).
CREATE OR REPLACE FUNCTION inbox_rotate(min_age INTERVAL DEFAULT INTERVAL '0') RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    current_generation BIGINT;
    current_started TIMESTAMPTZ;
    cut TIMESTAMPTZ;
    table_schema TEXT;
    old_index REGCLASS;
BEGIN
    LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE;
    SELECT generation, started_at INTO current_generation, current_started
        FROM inbox_generations WHERE ended_at IS NULL FOR UPDATE;
    IF current_generation IS NULL THEN
        RAISE EXCEPTION 'the inbox has no current generation; run the partitioned setup first';
    END IF;
    -- Every claim of the current generation has committed or rolled back
    -- (the lock waited for them), so no row is newer than this.
    cut := clock_timestamp();
    IF current_started > cut - min_age THEN
        RETURN NULL;
    END IF;
    SELECT n.nspname INTO table_schema
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = 'inbox_messages'::regclass;
    -- Archived generations are only looked up by key.
    FOR old_index IN
        SELECT indexrelid::regclass FROM pg_index
        WHERE indrelid = 'inbox_messages'::regclass AND NOT indisprimary
    LOOP
        EXECUTE format('DROP INDEX %s', old_index);
    END LOOP;
    EXECUTE format('ALTER TABLE %I.inbox_messages RENAME TO %I', table_schema, 'inbox_messages_g' || current_generation);
    -- The table's CHECK on generation implies the partition bound, so
    -- attaching does not scan it.
    EXECUTE format('ALTER TABLE %I.inbox_messages_archive ATTACH PARTITION %I.%I FOR VALUES FROM (%s) TO (%s)',
        table_schema, table_schema, 'inbox_messages_g' || current_generation,
        current_generation, current_generation + 1);
    PERFORM inbox_create_generation_table(table_schema, current_generation + 1);
    UPDATE inbox_generations SET ended_at = cut WHERE generation = current_generation;
    INSERT INTO inbox_generations (generation, started_at) VALUES (current_generation + 1, cut);
    RETURN current_generation + 1;
END
$$;
