-- Back to the 2026-12-04 inbox_create_generation_table (new generation
-- tables without fingerprint and result). The columns themselves belong to
-- the plain layout's 2026-12-06 migration, whose down.sql drops them.
DO $migration$
DECLARE
    inbox_schema TEXT;
BEGIN
    SELECT n.nspname INTO inbox_schema
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = 'inbox_messages'::regclass;
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
