//! The inbox schema as Diesel migrations, one set per backend.
//!
//! Run them with [`run_pending`], or through your own
//! `MigrationHarness`. They record themselves in Diesel's
//! `__diesel_schema_migrations` table under version `20261201000000`, so they
//! live beside your application's migrations without colliding. Users of
//! `diesel_cli` can instead copy `inbox-runtime/migrations/<backend>/` into
//! their migrations folder.

use diesel::migration::MigrationConnection;
use diesel::Connection;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness};

use crate::backend::InboxBackend;
use crate::error::InboxError;

/// The PostgreSQL migrations.
#[cfg(feature = "postgres")]
pub const POSTGRES: EmbeddedMigrations =
    diesel_migrations::embed_migrations!("migrations/postgres");
/// The SQLite migrations.
#[cfg(feature = "sqlite")]
pub const SQLITE: EmbeddedMigrations = diesel_migrations::embed_migrations!("migrations/sqlite");
/// The MySQL / MariaDB migrations.
#[cfg(feature = "mysql")]
pub const MYSQL: EmbeddedMigrations = diesel_migrations::embed_migrations!("migrations/mysql");

/// A backend whose inbox migrations are embedded in this crate.
pub trait EmbeddedInboxMigrations: InboxBackend {
    /// This backend's migrations.
    const MIGRATIONS: EmbeddedMigrations;
}

#[cfg(feature = "postgres")]
impl EmbeddedInboxMigrations for diesel::pg::Pg {
    const MIGRATIONS: EmbeddedMigrations = POSTGRES;
}
#[cfg(feature = "sqlite")]
impl EmbeddedInboxMigrations for diesel::sqlite::Sqlite {
    const MIGRATIONS: EmbeddedMigrations = SQLITE;
}
#[cfg(feature = "mysql")]
impl EmbeddedInboxMigrations for diesel::mysql::Mysql {
    const MIGRATIONS: EmbeddedMigrations = MYSQL;
}

/// Applies the inbox migrations that have not run on `conn` yet and returns
/// how many ran.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::{Connection, SqliteConnection};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// assert_eq!(inbox_runtime::migrations::run_pending(&mut conn)?, 1);
/// assert_eq!(inbox_runtime::migrations::run_pending(&mut conn)?, 0);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_pending<C>(conn: &mut C) -> Result<usize, InboxError>
where
    C: Connection + MigrationHarness<C::Backend> + MigrationConnection,
    C::Backend: EmbeddedInboxMigrations,
{
    let applied = conn
        .run_pending_migrations(<C::Backend as EmbeddedInboxMigrations>::MIGRATIONS)
        .map_err(InboxError::Migration)?;
    Ok(applied.len())
}
