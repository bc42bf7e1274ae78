-- The claim token (MySQL/MariaDB only): written by the claim of a
-- delivery on a blocking connection, a value new to that delivery, which
-- its commit checks is still there (the deadlock guard: InnoDB rolls the
-- whole transaction back on a deadlock, claim included, and a body that
-- ignored the error would otherwise commit what it wrote after it). NULL
-- or a stale value elsewhere, which nothing reads. MariaDB 10.3+ and
-- MySQL 8.0 add a trailing nullable column instantly. Safe to run again
-- (this file is also part of `inbox_runtime::setup()`); MySQL has no ADD
-- COLUMN IF NOT EXISTS, hence the prepared statement.
SET @inbox_messages_ddl = IF(
    EXISTS (SELECT 1 FROM information_schema.columns
            WHERE table_schema = DATABASE() AND table_name = 'inbox_messages'
              AND column_name = 'claim_token'),
    'DO 0',
    'ALTER TABLE inbox_messages ADD COLUMN claim_token BINARY(16) NULL');
PREPARE inbox_messages_ddl FROM @inbox_messages_ddl;
EXECUTE inbox_messages_ddl;
DEALLOCATE PREPARE inbox_messages_ddl;
