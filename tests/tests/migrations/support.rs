//! The application's migrations and what the tests ask of a migrated
//! database.

use diesel::Connection;
use diesel::migration::MigrationSource;
use diesel_migrations::{
    EmbeddedMigrations, FileBasedMigrations, MigrationHarness, embed_migrations,
};
use inbox_runtime::migrations::{EmbeddedInboxMigrations, InboxMigrations};
use inbox_runtime::{Claim, ClaimKey, HandlerName, claim};
use inbox_tests::{DieselBackend, TestBackend};

/// The application's migrations, embedded.
pub const APP: EmbeddedMigrations = embed_migrations!("tests/migrations/app");
pub const APP_OLDER: &str = "20200101000000";
pub const APP_NEWER: &str = "29990101000000";

/// The same migrations as [`APP`], read from the folder at run time.
pub fn app_files() -> FileBasedMigrations {
    FileBasedMigrations::from_path(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/migrations/app"))
        .expect("the test's application migrations")
}

/// A source's versions, oldest first.
pub fn versions<DB: diesel::backend::Backend>(source: &impl MigrationSource<DB>) -> Vec<String> {
    let mut versions: Vec<String> = source
        .migrations()
        .expect("list the migrations")
        .iter()
        .map(|migration| migration.name().version().to_string())
        .collect();
    versions.sort();
    versions
}

/// Every version of the application's and the inbox's migrations, oldest first.
pub fn all_versions<DB: EmbeddedInboxMigrations>() -> Vec<String> {
    let mut all = versions::<DB>(&APP);
    all.extend(versions::<DB>(&InboxMigrations));
    all.sort();
    assert_eq!(all.first().map(String::as_str), Some(APP_OLDER));
    assert_eq!(all.last().map(String::as_str), Some(APP_NEWER));
    assert!(all.len() > 2, "the inbox has migrations: {all:?}");
    all
}

pub fn applied<C, DB>(conn: &mut C) -> Vec<String>
where
    C: MigrationHarness<DB>,
    DB: diesel::backend::Backend,
{
    let mut applied: Vec<String> = conn
        .applied_migrations()
        .expect("read the applied versions")
        .iter()
        .map(ToString::to_string)
        .collect();
    applied.sort();
    applied
}

pub fn table_exists(conn: &mut impl Connection, table: &str) -> bool {
    conn.batch_execute(&format!("SELECT 1 FROM {table} WHERE 1 = 0"))
        .is_ok()
}

/// A test database with nothing in it: the harness's inbox table is dropped,
/// so only migrations create tables.
pub fn empty<B>() -> Option<(B, B::Connection)>
where
    B: TestBackend,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let db = B::open()?;
    let mut conn = db.connect();
    inbox_runtime::schema::teardown(&mut conn).expect("drop the harness's inbox table");
    assert!(!table_exists(&mut conn, "inbox_messages"));
    Some((db, conn))
}

/// The inbox table is there and deduplicates.
pub fn assert_inbox_works<C>(conn: &mut C, id: &str)
where
    C: diesel::connection::LoadConnection,
    C::Backend: EmbeddedInboxMigrations,
{
    let key = ClaimKey::new(HandlerName::new("migrations.test").unwrap(), id).unwrap();
    let first = conn
        .transaction(|conn| claim(conn, &key))
        .expect("claim in the migrated inbox");
    let second = conn
        .transaction(|conn| claim(conn, &key))
        .expect("claim again");
    assert_eq!((first, second), (Claim::Claimed, Claim::Duplicate));
}

pub fn assert_nothing_left(conn: &mut impl Connection) {
    for table in ["inbox_messages", "app_accounts", "app_ledger"] {
        assert!(!table_exists(conn, table), "{table} is still there");
    }
}
