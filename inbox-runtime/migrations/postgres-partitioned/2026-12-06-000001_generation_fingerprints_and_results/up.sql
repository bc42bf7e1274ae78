-- The generation layout with the plain layout's 2026-12-06 columns
-- (fingerprint, result): the archive and the current table get them if they
-- lack them (the plain migration does too, in whichever order the two run),
-- and new generation tables are created with them, so rotation keeps
-- attaching the current table to the archive. Safe to run again;
-- `prune::partitioned::setup()` runs it after the earlier ones. The function
-- body is a template, as in 2026-12-04.
DO $migration$
DECLARE
    inbox_schema TEXT;
BEGIN
    SELECT n.nspname INTO inbox_schema
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = 'inbox_messages'::regclass;
    IF to_regclass(format('%I.inbox_messages_archive', inbox_schema)) IS NULL THEN
        RAISE EXCEPTION 'schema % has no generation layout beside its inbox_messages', inbox_schema
            USING HINT = 'run 2026-12-02-000000_partition_inbox_messages first, in the same schema';
    END IF;
    EXECUTE format('ALTER TABLE %I.inbox_messages_archive
        ADD COLUMN IF NOT EXISTS fingerprint BYTEA NULL, ADD COLUMN IF NOT EXISTS result BYTEA NULL', inbox_schema);
    EXECUTE format('ALTER TABLE %I.inbox_messages
        ADD COLUMN IF NOT EXISTS fingerprint BYTEA NULL, ADD COLUMN IF NOT EXISTS result BYTEA NULL', inbox_schema);

    EXECUTE replace(replace($template$
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
            fingerprint BYTEA       NULL,
            result      BYTEA       NULL,
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
$template$, '@schema_literal@', quote_literal(inbox_schema)), '@schema@', quote_ident(inbox_schema));
END
$migration$;
