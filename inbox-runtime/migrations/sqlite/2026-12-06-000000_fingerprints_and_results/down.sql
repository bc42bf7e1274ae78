ALTER TABLE inbox_messages DROP COLUMN result;
ALTER TABLE inbox_messages DROP COLUMN fingerprint;
