-- The example application's second migration, newer than the inbox's: the
-- payments its idempotent handler records.
CREATE TABLE payments (
    id         INTEGER NOT NULL PRIMARY KEY,
    account_id INTEGER NOT NULL REFERENCES accounts (id),
    cents      BIGINT  NOT NULL
);
