-- The generation layout's functions of 2026-12-02, replaced (same
-- signatures: the trigger on the current table keeps calling the guard).
-- Safe to run again; `prune::partitioned::setup()` runs it after the
-- conversion.
--
-- 1. inbox_rotate() checks whether a rotation is due before it locks
--    anything. It used to take ACCESS EXCLUSIVE on the current table first:
--    with one handler transaction open, a maintenance run that had nothing to
--    do waited for it, every new claim queued behind the run, and after the
--    lock timeout the run failed (55P03). Now a run that is not due takes no
--    lock; a due run locks, then checks again (a rotation by another session
--    may have ended the generation while it waited).
-- 2. Every name is qualified with the inbox's schema (the schema of the
--    inbox_messages this migration sees), and each function runs with its
--    search_path set to that schema: two inboxes in two schemas of one
--    database never reach each other's tables, whatever the caller's
--    search_path.
-- 3. New generation tables get the index on (handler, received_at AT TIME
--    ZONE 'UTC') and received_at DEFAULT statement_timestamp(), like the
--    plain table since 2026-12-03; the current table gets them here if it
--    lacks them.
--
-- The function bodies are templates: @schema@ becomes the schema as an
-- identifier, @schema_literal@ as a string literal.
DO $migration$
DECLARE
    inbox_schema TEXT;
    valid BOOLEAN;
    received_default TEXT;
BEGIN
    SELECT n.nspname INTO inbox_schema
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = 'inbox_messages'::regclass;
    IF to_regclass(format('%I.inbox_generations', inbox_schema)) IS NULL
       OR to_regclass(format('%I.inbox_messages_archive', inbox_schema)) IS NULL THEN
        RAISE EXCEPTION 'schema % has no generation layout beside its inbox_messages', inbox_schema
            USING HINT = 'run 2026-12-02-000000_partition_inbox_messages first, in the same schema';
    END IF;

    EXECUTE replace(replace($template$
-- Fires before every insert into the current generation's table;
-- TG_ARGV[0] is that table's generation.
CREATE OR REPLACE FUNCTION @schema@.inbox_claim_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $body$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM @schema@.inbox_generations
                   WHERE generation = TG_ARGV[0]::bigint AND ended_at IS NULL) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'serialization_failure',
            MESSAGE = 'the inbox started a new generation after this transaction took its snapshot',
            HINT = 'retry the transaction';
    END IF;
    IF EXISTS (SELECT 1 FROM @schema@.inbox_messages_archive AS archived
               WHERE archived.handler = NEW.handler AND archived.message_id = NEW.message_id) THEN
        RETURN NULL; -- claimed in an earlier generation: a duplicate
    END IF;
    RETURN NEW;
END
$body$;

-- Creates the current generation's table in schema target_schema (the
-- inbox's own, as inbox_rotate passes it).
CREATE OR REPLACE FUNCTION @schema@.inbox_create_generation_table(target_schema TEXT, new_generation BIGINT) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $body$
DECLARE
    prefix TEXT := 'inbox_messages_g' || new_generation;
BEGIN
    EXECUTE format(
        'CREATE TABLE %1$I.inbox_messages (
            handler     TEXT        NOT NULL CHECK (octet_length(handler) BETWEEN 1 AND 255),
            message_id  TEXT        NOT NULL CHECK (octet_length(message_id) BETWEEN 1 AND 255),
            received_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
            generation  BIGINT      NOT NULL DEFAULT %2$s,
            CONSTRAINT %3$I CHECK (generation >= %2$s AND generation < %4$s),
            CONSTRAINT %5$I PRIMARY KEY (handler, message_id)
        )',
        target_schema, new_generation, prefix || '_generation', new_generation + 1, prefix || '_pkey');
    -- The plain layout's names (free again: rotation drops the archived
    -- table's indexes first), so the plain setup finds them.
    EXECUTE format('CREATE INDEX inbox_messages_received_at_idx ON %I.inbox_messages (received_at)', target_schema);
    EXECUTE format(
        'CREATE INDEX inbox_messages_handler_received_at_idx ON %I.inbox_messages (handler, (received_at AT TIME ZONE ''UTC''))',
        target_schema);
    EXECUTE format(
        'CREATE TRIGGER inbox_messages_claim_guard BEFORE INSERT ON %1$I.inbox_messages
         FOR EACH ROW EXECUTE FUNCTION %1$I.inbox_claim_guard(%2$L)',
        target_schema, new_generation::text);
END
$body$;

-- Ends the current generation if it started at least min_age ago: the table
-- becomes a partition of the archive and an empty one takes its place.
-- Returns the new generation, or NULL when the current one is younger than
-- min_age. A rotation that is not due locks nothing. A due one waits for
-- claims in progress, and new claims queue behind it: set lock_timeout to
-- bound the wait.
CREATE OR REPLACE FUNCTION @schema@.inbox_rotate(min_age INTERVAL DEFAULT INTERVAL '0') RETURNS BIGINT
LANGUAGE plpgsql
SET search_path = pg_catalog, @schema@, pg_temp
AS $body$
DECLARE
    inbox_schema CONSTANT TEXT := @schema_literal@;
    current_generation BIGINT;
    current_started TIMESTAMPTZ;
    cut TIMESTAMPTZ;
    old_index TEXT;
BEGIN
    -- Due? Checked without a lock: a run with nothing to do neither waits
    -- for claims in progress nor makes new claims wait behind it.
    SELECT generation, started_at INTO current_generation, current_started
        FROM @schema@.inbox_generations WHERE ended_at IS NULL;
    IF current_generation IS NULL THEN
        RAISE EXCEPTION 'the inbox has no current generation; run the partitioned setup first';
    END IF;
    IF current_started > clock_timestamp() - min_age THEN
        RETURN NULL;
    END IF;
    LOCK TABLE @schema@.inbox_messages IN ACCESS EXCLUSIVE MODE;
    -- Again, holding the lock: another rotation may have ended this
    -- generation while this one waited.
    SELECT generation, started_at INTO current_generation, current_started
        FROM @schema@.inbox_generations WHERE ended_at IS NULL FOR UPDATE;
    -- Every claim of the current generation has committed or rolled back
    -- (the lock waited for them), so no row is newer than this.
    cut := clock_timestamp();
    IF current_generation IS NULL OR current_started > cut - min_age THEN
        RETURN NULL;
    END IF;
    -- Archived generations are only looked up by key.
    FOR old_index IN
        SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        WHERE x.indrelid = format('%I.inbox_messages', inbox_schema)::regclass AND NOT x.indisprimary
    LOOP
        EXECUTE format('DROP INDEX %I.%I', inbox_schema, old_index);
    END LOOP;
    EXECUTE format('ALTER TABLE %I.inbox_messages RENAME TO %I', inbox_schema, 'inbox_messages_g' || current_generation);
    -- The table's CHECK on generation implies the partition bound, so
    -- attaching does not scan it.
    EXECUTE format('ALTER TABLE %I.inbox_messages_archive ATTACH PARTITION %I.%I FOR VALUES FROM (%s) TO (%s)',
        inbox_schema, inbox_schema, 'inbox_messages_g' || current_generation,
        current_generation, current_generation + 1);
    PERFORM @schema@.inbox_create_generation_table(inbox_schema, current_generation + 1);
    UPDATE @schema@.inbox_generations SET ended_at = cut WHERE generation = current_generation;
    INSERT INTO @schema@.inbox_generations (generation, started_at) VALUES (current_generation + 1, cut);
    RETURN current_generation + 1;
END
$body$;
$template$, '@schema_literal@', quote_literal(inbox_schema)), '@schema@', quote_ident(inbox_schema));

    -- The current table, as inbox_create_generation_table now makes them.
    SELECT x.indisvalid INTO valid
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        WHERE x.indrelid = format('%I.inbox_messages', inbox_schema)::regclass
          AND i.relname = 'inbox_messages_handler_received_at_idx';
    IF valid IS NULL THEN
        EXECUTE format(
            'CREATE INDEX inbox_messages_handler_received_at_idx ON %I.inbox_messages (handler, (received_at AT TIME ZONE ''UTC''))',
            inbox_schema);
    ELSIF NOT valid THEN
        RAISE EXCEPTION 'inbox_messages_handler_received_at_idx is invalid (an interrupted CREATE INDEX CONCURRENTLY?)'
            USING HINT = 'DROP INDEX inbox_messages_handler_received_at_idx, then build it again';
    END IF;
    SELECT pg_get_expr(d.adbin, d.adrelid) INTO received_default
        FROM pg_attrdef d
        JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        WHERE d.adrelid = format('%I.inbox_messages', inbox_schema)::regclass AND a.attname = 'received_at';
    IF received_default IS DISTINCT FROM 'statement_timestamp()' THEN
        EXECUTE format('ALTER TABLE %I.inbox_messages ALTER COLUMN received_at SET DEFAULT statement_timestamp()',
            inbox_schema);
    END IF;
END
$migration$;
