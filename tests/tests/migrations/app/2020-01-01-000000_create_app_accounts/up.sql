-- An application migration older than the inbox's (same SQL on every backend).
CREATE TABLE app_accounts (
    id    INTEGER     NOT NULL PRIMARY KEY,
    owner VARCHAR(64) NOT NULL
);
