//! An inbox as an earlier version of the crate left it: created by the
//! inbox's migrations older than a given one, to upgrade from.

use diesel::migration::{Migration, MigrationConnection, MigrationSource};
use diesel_migrations::MigrationHarness;
use inbox_runtime::migrations::{EmbeddedInboxMigrations, InboxMigrations};

use crate::{DieselBackend, TestBackend};

/// Replaces the inbox on `conn` (which the harness created at the latest
/// schema) with one made by every inbox migration whose version is below
/// `version` (`"20261205000000"`), run and recorded as Diesel runs them.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use inbox_tests::{Sqlite, SqlRows, TestBackend};
///
/// let db = Sqlite::open().unwrap();
/// let mut conn = db.connect();
/// inbox_tests::migrate_inbox_before::<Sqlite>(&mut conn, "20261205000000");
/// let failures = conn.bigint(
///     "SELECT COUNT(*) AS value FROM sqlite_master WHERE name = 'inbox_failures'",
/// );
/// assert_eq!(failures, 0, "inbox_failures came with 2026-12-05");
/// # }
/// ```
pub fn migrate_inbox_before<B>(conn: &mut B::Connection, version: &str)
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>> + MigrationConnection,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    inbox_runtime::schema::teardown(conn).expect("drop the harness's inbox");
    MigrationConnection::setup(conn).expect("the migrations table");
    let mut earlier = inbox_migrations::<B>();
    earlier.retain(|migration| migration.name().version().to_string().as_str() < version);
    assert!(
        !earlier.is_empty(),
        "no inbox migration is older than {version}"
    );
    for migration in &earlier {
        conn.run_migration(&**migration as &dyn Migration<DieselBackend<B>>)
            .expect("an older migration");
    }
}

/// The versions of the inbox's migrations for `B` from `version` on,
/// newest first: what an inbox made by [`migrate_inbox_before`] runs to
/// catch up, in the order it reverts them.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use inbox_tests::Sqlite;
///
/// let since = inbox_tests::inbox_migrations_since::<Sqlite>("20261205000000");
/// assert_eq!(since.last().map(String::as_str), Some("20261205000000"));
/// assert!(since.windows(2).all(|pair| pair[0] > pair[1]));
/// # }
/// ```
pub fn inbox_migrations_since<B>(version: &str) -> Vec<String>
where
    B: TestBackend,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let mut since: Vec<String> = inbox_migrations::<B>()
        .iter()
        .map(|migration| migration.name().version().to_string())
        .filter(|each| each.as_str() >= version)
        .collect();
    since.reverse();
    since
}

/// The inbox's migrations for `B`, oldest first.
fn inbox_migrations<B>() -> Vec<Box<dyn Migration<DieselBackend<B>>>>
where
    B: TestBackend,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let mut migrations =
        MigrationSource::<DieselBackend<B>>::migrations(&InboxMigrations).expect("the migrations");
    migrations.sort_by_key(|migration| migration.name().version().to_string());
    migrations
}
