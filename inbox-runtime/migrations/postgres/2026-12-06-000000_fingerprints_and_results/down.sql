DO $$
BEGIN
    IF to_regclass('inbox_messages_archive') IS NOT NULL THEN
        ALTER TABLE inbox_messages_archive DROP COLUMN IF EXISTS result, DROP COLUMN IF EXISTS fingerprint;
    END IF;
END
$$;
ALTER TABLE inbox_messages DROP COLUMN IF EXISTS result, DROP COLUMN IF EXISTS fingerprint;
