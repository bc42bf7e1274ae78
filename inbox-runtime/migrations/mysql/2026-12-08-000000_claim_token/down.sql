ALTER TABLE inbox_messages DROP COLUMN claim_token;
