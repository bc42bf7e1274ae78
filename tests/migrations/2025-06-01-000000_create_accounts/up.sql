-- The application migration of the guide's schema chapter
-- (docs/src/schema.md), embedded by its example as `embed_migrations!("migrations")`.
CREATE TABLE accounts (
    id      INTEGER NOT NULL PRIMARY KEY,
    balance BIGINT  NOT NULL
);
