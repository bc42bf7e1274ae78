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
//! Each backend's DDL and the wiring of its migrations live in its file of
//! the `backend` module; this module runs them.
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

/// Creates the inbox table and its indexes if they do not exist yet, and
/// brings an inbox created by an earlier version of this crate up to date
/// (the same changes as the migrations added since: on PostgreSQL and MySQL
/// an index, and on PostgreSQL the `received_at` default, each only when
/// missing; on SQLite a rebuild of a table whose length checks count bytes
/// in the database's encoding, once). Running it again changes nothing.
/// Setups started at once take turns (PostgreSQL: a transaction-scoped
/// advisory lock per schema; MySQL/MariaDB: a named lock per database), so
/// services starting together can each call it.
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
    <C::Backend as InboxBackend>::setup_in_turn(conn, |conn| {
        conn.batch_execute(<C::Backend as InboxBackend>::CREATE_SCHEMA_SQL)?;
        <C::Backend as InboxBackend>::upgrade_schema(conn)
    })?;
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
    pub use crate::backend::postgres::table::inbox_messages;
}

/// The inbox table for SQLite queries of your own (dashboards, tests).
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use crate::backend::sqlite::table::inbox_messages;
}

/// The inbox table for MySQL/MariaDB queries of your own (dashboards, tests).
///
/// The id columns are `VARBINARY` in the database and read as UTF-8 text.
#[cfg(feature = "mysql")]
pub mod mysql {
    pub use crate::backend::mysql::table::inbox_messages;
}
