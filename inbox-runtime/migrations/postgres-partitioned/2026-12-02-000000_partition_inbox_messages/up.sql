-- The generation layout for large inboxes (PostgreSQL 14 or later). Runs after
-- the plain schema (2026-12-01-000000_create_inbox_messages) and converts it.
--
-- Why not a table range-partitioned on received_at: PostgreSQL requires every
-- unique constraint of a partitioned table to include the partition key, so
-- the key would become (handler, message_id, received_at). received_at is the
-- time of each delivery, so a redelivery would get a new key and be claimed
-- again: no deduplication at all, not even inside one partition. And the claim
-- statement's ON CONFLICT (handler, message_id) needs a unique index on exactly
-- those columns.
--
-- So the inbox keeps one plain table, inbox_messages, for the current
-- generation of claims, with the primary key (handler, message_id) the claim
-- relies on. Earlier generations are partitions of inbox_messages_archive,
-- range-partitioned by generation number, each covering a span of received_at
-- recorded in inbox_generations. inbox_rotate() renames the current table into
-- the archive and starts an empty one; pruning detaches and drops whole
-- archived generations. A trigger on the current table turns a claim of an id
-- already in the archive into a duplicate (the insert is skipped, so the claim
-- reports zero rows), and raises a serialization failure (40001, retryable)
-- when a transaction's snapshot predates the latest rotation: under REPEATABLE
-- READ or SERIALIZABLE such a snapshot could miss ids archived by it.

CREATE TABLE IF NOT EXISTS inbox_generations (
    generation BIGINT      PRIMARY KEY,
    started_at TIMESTAMPTZ NOT NULL,
    ended_at   TIMESTAMPTZ,
    CONSTRAINT inbox_generations_ordered CHECK (ended_at IS NULL OR ended_at >= started_at)
);
-- At most one current (open) generation.
CREATE UNIQUE INDEX IF NOT EXISTS inbox_generations_one_current
    ON inbox_generations ((ended_at IS NULL)) WHERE ended_at IS NULL;

CREATE TABLE IF NOT EXISTS inbox_messages_archive (
    handler     TEXT        NOT NULL,
    message_id  TEXT        NOT NULL,
    received_at TIMESTAMPTZ NOT NULL,
    generation  BIGINT      NOT NULL
) PARTITION BY RANGE (generation);

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

-- Converts the plain table into generation 1 (once). On a large existing
-- table, ADD CONSTRAINT scans it while holding an exclusive lock: convert
-- while the table is small, or add the column and a NOT VALID constraint
-- first and VALIDATE it separately.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM inbox_generations) THEN
        IF NOT EXISTS (SELECT 1 FROM pg_attribute
                       WHERE attrelid = 'inbox_messages'::regclass
                         AND attname = 'generation' AND NOT attisdropped) THEN
            ALTER TABLE inbox_messages ADD COLUMN generation BIGINT NOT NULL DEFAULT 1;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conrelid = 'inbox_messages'::regclass
                         AND conname = 'inbox_messages_g1_generation') THEN
            ALTER TABLE inbox_messages ADD CONSTRAINT inbox_messages_g1_generation
                CHECK (generation >= 1 AND generation < 2);
        END IF;
        CREATE TRIGGER inbox_messages_claim_guard BEFORE INSERT ON inbox_messages
            FOR EACH ROW EXECUTE FUNCTION inbox_claim_guard('1');
        INSERT INTO inbox_generations (generation, started_at) VALUES (1, now());
    END IF;
END
$$;
