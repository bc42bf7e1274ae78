-- Payload fingerprints and stored results (`#[idempotent(fingerprint = ...,
-- store_result)]`), kept with each claim: fingerprint is the SHA-256 of the
-- payload's canonical encoding (32 bytes), result the handler's result as
-- JSON (at most 64 KiB, checked by the runtime). Both NULL for claims made
-- without them, which keep working as before. Adding nullable columns
-- without a default only changes the catalog: no rewrite, no scan. Safe to
-- run again (this file is also part of `inbox_runtime::setup()`).
ALTER TABLE inbox_messages
    ADD COLUMN IF NOT EXISTS fingerprint BYTEA NULL,
    ADD COLUMN IF NOT EXISTS result BYTEA NULL;
-- The generation layout (prune::partitioned): the archive must keep the
-- current table's columns, or the next rotation could not attach it. Its
-- own migration of the same date makes new generation tables with them.
DO $$
BEGIN
    IF to_regclass('inbox_messages_archive') IS NOT NULL THEN
        ALTER TABLE inbox_messages_archive
            ADD COLUMN IF NOT EXISTS fingerprint BYTEA NULL,
            ADD COLUMN IF NOT EXISTS result BYTEA NULL;
    END IF;
END
$$;
