-- An application migration newer than every inbox migration (same SQL on
-- every backend), so that the newest applied version is the application's.
CREATE TABLE app_ledger (
    id         INTEGER NOT NULL PRIMARY KEY,
    account_id INTEGER NOT NULL,
    cents      BIGINT  NOT NULL
);
