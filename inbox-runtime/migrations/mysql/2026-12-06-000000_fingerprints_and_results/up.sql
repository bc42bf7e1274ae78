-- Payload fingerprints and stored results (`#[idempotent(fingerprint = ...,
-- store_result)]`), kept with each claim: fingerprint is the SHA-256 of the
-- payload's canonical encoding, result the handler's result as JSON (at
-- most 64 KiB, checked by the runtime; MEDIUMBLOB because BLOB stops one
-- byte short). Both NULL for claims made without them, which keep working
-- as before. MariaDB 10.3+ and MySQL 8.0 add trailing nullable columns
-- instantly. Safe to run again (this file is also part of
-- `inbox_runtime::setup()`); MySQL has no ADD COLUMN IF NOT EXISTS, hence
-- the prepared statement.
SET @inbox_messages_ddl = IF(
    EXISTS (SELECT 1 FROM information_schema.columns
            WHERE table_schema = DATABASE() AND table_name = 'inbox_messages'
              AND column_name = 'fingerprint'),
    'DO 0',
    'ALTER TABLE inbox_messages ADD COLUMN fingerprint VARBINARY(32) NULL, ADD COLUMN result MEDIUMBLOB NULL');
PREPARE inbox_messages_ddl FROM @inbox_messages_ddl;
EXECUTE inbox_messages_ddl;
DEALLOCATE PREPARE inbox_messages_ddl;
