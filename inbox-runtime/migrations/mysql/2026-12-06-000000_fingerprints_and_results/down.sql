ALTER TABLE inbox_messages DROP COLUMN result, DROP COLUMN fingerprint;
