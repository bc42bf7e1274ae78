//! The inbox table: its definition per backend, and creating it.
//!
//! | column | PostgreSQL | SQLite | MySQL / MariaDB |
//! |---|---|---|---|
//! | `handler` | `TEXT`, 1–255 bytes | `TEXT`, 1–255 bytes | `VARBINARY(255)` |
//! | `message_id` | `TEXT`, 1–255 bytes | `TEXT`, 1–255 bytes | `VARBINARY(255)` |
//! | `received_at` | `TIMESTAMPTZ DEFAULT statement_timestamp()` | `TEXT` UTC, ms (`strftime`) | `DATETIME(6) DEFAULT UTC_TIMESTAMP(6)` |
//!
//! The primary key is `(handler, message_id)`. Two indexes serve pruning:
//! `received_at` (every handler's expired rows, oldest first) and
//! `(handler, received_at)` (one handler's). The timestamp always comes from
//! the database clock at the start of the claim's statement (not of its
//! transaction), so application servers with skewed clocks, or a claim made
//! late in a long transaction, cannot shorten the retention window. On MySQL
//! the ids are bytes so that comparison is exact: a case-insensitive or
//! space-padding collation would merge distinct ids. On SQLite the 255-byte
//! limits count UTF-8 bytes whatever the database's encoding (in a UTF-16
//! database the table's check is a looser backstop, 510 UTF-16 bytes; ids are
//! checked exactly before every claim).
//!
//! Three ways to create it, pick one:
//! - [`setup`]: runs [`InboxBackend::CREATE_SCHEMA_SQL`] (idempotent), and
//!   brings an inbox created by an earlier version up to date.
//! - Diesel migrations: `inbox_runtime::migrations` (feature `migrations`),
//!   or copy `inbox-runtime/migrations/<backend>/` into your migrations folder
//!   for `diesel_cli`.
//! - The raw SQL constants, for any other migration tool: the migrations'
//!   `up.sql` files, in order, or [`InboxBackend::CREATE_SCHEMA_SQL`] for a new
//!   inbox.

use diesel::connection::Connection;

use crate::backend::InboxBackend;
use crate::error::InboxError;

/// Includes a migration's SQL file.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! migration_sql {
    ($backend:literal, $migration:literal, $file:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/migrations/",
            $backend,
            "/",
            $migration,
            "/",
            $file
        ))
    };
}

/// PostgreSQL's latest schema: the migrations' `up.sql` files, in order. The
/// later ones check the catalog before changing anything, so running it on
/// an up-to-date inbox changes nothing.
#[cfg(feature = "postgres")]
pub(crate) const POSTGRES_SCHEMA_SQL: &str = concat!(
    migration_sql!(
        "postgres",
        "2026-12-01-000000_create_inbox_messages",
        "up.sql"
    ),
    "\n",
    migration_sql!(
        "postgres",
        "2026-12-03-000000_handler_index_and_statement_clock",
        "up.sql"
    ),
);

/// MySQL's latest schema: the migrations' `up.sql` files, in order (the
/// index is created only when missing).
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_SCHEMA_SQL: &str = concat!(
    migration_sql!("mysql", "2026-12-01-000000_create_inbox_messages", "up.sql"),
    "\n",
    migration_sql!("mysql", "2026-12-03-000000_handler_index", "up.sql"),
);

/// SQLite's latest schema, written out: its 2026-12-03 migration rebuilds the
/// table, which [`setup`] does only for a table that needs it
/// ([`upgrade_sqlite`]).
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE_SCHEMA_SQL: &str = include_str!("schema/sqlite.sql");

/// The rebuild of an SQLite inbox created before 2026-12-03.
#[cfg(feature = "sqlite")]
const SQLITE_REBUILD_SQL: &str = migration_sql!(
    "sqlite",
    "2026-12-03-000000_handler_index_and_encoding_independent_checks",
    "up.sql"
);

/// Rebuilds an SQLite inbox whose length checks count bytes in the database's
/// encoding (created before 2026-12-03: in a UTF-16 database they refuse
/// valid ids), in one transaction; an inbox already rebuilt is left alone.
///
/// The table's definition is read from `sqlite_master`. Only a count can come
/// back through a generic `Connection`, so the check is an `INSERT … SELECT`
/// into a temporary table, which counts the outdated definitions.
#[cfg(feature = "sqlite")]
pub(crate) fn upgrade_sqlite<C>(conn: &mut C) -> diesel::QueryResult<()>
where
    C: Connection<Backend = diesel::sqlite::Sqlite>,
{
    conn.transaction(|conn| {
        conn.batch_execute(
            "CREATE TEMP TABLE IF NOT EXISTS inbox_outdated_schema (name TEXT); \
             DELETE FROM temp.inbox_outdated_schema",
        )?;
        let outdated = conn.execute_returning_count(&diesel::sql_query(
            "INSERT INTO temp.inbox_outdated_schema (name) \
             SELECT name FROM main.sqlite_master \
             WHERE type = 'table' AND name = 'inbox_messages' \
               AND (instr(sql, 'length(CAST(handler AS BLOB)) BETWEEN 1 AND 255)') > 0 \
                 OR instr(sql, 'length(CAST(message_id AS BLOB)) BETWEEN 1 AND 255)') > 0)",
        ))?;
        conn.batch_execute("DROP TABLE temp.inbox_outdated_schema")?;
        if outdated > 0 {
            conn.batch_execute(SQLITE_REBUILD_SQL)?;
        }
        Ok(())
    })
}

/// Creates the inbox table and its indexes if they do not exist yet, and
/// brings an inbox created by an earlier version of this crate up to date
/// (the same changes as the migrations added since: on PostgreSQL and MySQL
/// an index, and on PostgreSQL the `received_at` default, each only when
/// missing; on SQLite a rebuild of a table whose length checks count bytes
/// in the database's encoding, once). Running it again changes nothing.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::{Connection, SqliteConnection};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// inbox_runtime::setup(&mut conn)?; // running it again is harmless
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn setup<C>(conn: &mut C) -> Result<(), InboxError>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    conn.batch_execute(<C::Backend as InboxBackend>::CREATE_SCHEMA_SQL)?;
    <C::Backend as InboxBackend>::upgrade_schema(conn)?;
    Ok(())
}

/// Drops the inbox table. Every remembered id is forgotten: redeliveries of
/// messages already processed will be processed again.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::{Connection, SqliteConnection};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// inbox_runtime::schema::teardown(&mut conn)?;
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn teardown<C>(conn: &mut C) -> Result<(), InboxError>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    conn.batch_execute(<C::Backend as InboxBackend>::DROP_SCHEMA_SQL)?;
    Ok(())
}

/// The inbox table for PostgreSQL queries of your own (dashboards, tests).
#[cfg(feature = "postgres")]
pub mod postgres {
    diesel::table! {
        /// Claimed message ids, one row per `(handler, message_id)`.
        inbox_messages (handler, message_id) {
            /// The handler's deduplication scope.
            handler -> Text,
            /// The producer-assigned message id.
            message_id -> Text,
            /// When the id was claimed, by the database clock.
            received_at -> Timestamptz,
        }
    }
}

/// The inbox table for SQLite queries of your own (dashboards, tests).
#[cfg(feature = "sqlite")]
pub mod sqlite {
    diesel::table! {
        /// Claimed message ids, one row per `(handler, message_id)`.
        inbox_messages (handler, message_id) {
            /// The handler's deduplication scope.
            handler -> Text,
            /// The producer-assigned message id.
            message_id -> Text,
            /// When the id was claimed (UTC), by the database clock.
            received_at -> Timestamp,
        }
    }
}

/// The inbox table for MySQL/MariaDB queries of your own (dashboards, tests).
///
/// The id columns are `VARBINARY` in the database and read as UTF-8 text.
#[cfg(feature = "mysql")]
pub mod mysql {
    diesel::table! {
        /// Claimed message ids, one row per `(handler, message_id)`.
        inbox_messages (handler, message_id) {
            /// The handler's deduplication scope.
            handler -> Text,
            /// The producer-assigned message id.
            message_id -> Text,
            /// When the id was claimed (UTC), by the database clock.
            received_at -> Datetime,
        }
    }
}
