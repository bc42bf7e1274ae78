-- The example application's first migration, older than the inbox's.
CREATE TABLE accounts (
    id    INTEGER     NOT NULL PRIMARY KEY,
    owner VARCHAR(64) NOT NULL
);
