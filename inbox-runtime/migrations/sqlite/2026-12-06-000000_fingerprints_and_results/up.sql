-- Payload fingerprints and stored results (`#[idempotent(fingerprint = ...,
-- store_result)]`), kept with each claim: fingerprint is the SHA-256 of the
-- payload's canonical encoding, result the handler's result as JSON (at
-- most 64 KiB, checked by the runtime). Both NULL for claims made without
-- them, which keep working as before. (`inbox_runtime::setup()` adds the
-- columns only where they are missing: SQLite has no ADD COLUMN IF NOT
-- EXISTS.)
ALTER TABLE inbox_messages ADD COLUMN fingerprint BLOB NULL;
ALTER TABLE inbox_messages ADD COLUMN result BLOB NULL;
