//! The inbox table: its definition per backend, and creating it.
//!
//! | column | PostgreSQL | SQLite | MySQL / MariaDB |
//! |---|---|---|---|
//! | `handler` | `TEXT`, 1–255 bytes | `TEXT`, 1–255 bytes | `VARBINARY(255)` |
//! | `message_id` | `TEXT`, 1–255 bytes | `TEXT`, 1–255 bytes | `VARBINARY(255)` |
//! | `received_at` | `TIMESTAMPTZ DEFAULT now()` | `TEXT` UTC, ms (`strftime`) | `DATETIME(6) DEFAULT UTC_TIMESTAMP(6)` |
//!
//! The primary key is `(handler, message_id)`, and `received_at` is indexed
//! for pruning. The timestamp always comes from the database clock, so
//! application servers with skewed clocks cannot shorten the retention window.
//! On MySQL the ids are bytes so that comparison is exact: a case-insensitive
//! or space-padding collation would merge distinct ids.
//!
//! Three ways to create it, pick one:
//! - [`setup`]: runs [`InboxBackend::CREATE_SCHEMA_SQL`] (idempotent).
//! - Diesel migrations: `inbox_runtime::migrations` (feature `migrations`),
//!   or copy `inbox-runtime/migrations/<backend>/` into your migrations folder
//!   for `diesel_cli`.
//! - The raw SQL constants, for any other migration tool.

use diesel::connection::Connection;

use crate::backend::InboxBackend;
use crate::error::InboxError;

/// Creates the inbox table and its index if they do not exist yet.
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
