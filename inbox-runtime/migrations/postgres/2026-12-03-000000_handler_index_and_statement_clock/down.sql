ALTER TABLE inbox_messages ALTER COLUMN received_at SET DEFAULT now();
DROP INDEX IF EXISTS inbox_messages_handler_received_at_idx;
