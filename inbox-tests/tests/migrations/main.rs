//! The inbox's embedded migrations beside an application's own, on real
//! databases: PostgreSQL, MariaDB/MySQL and SQLite (`inbox_tests::testdb`).
//!
//! The application's migrations (`tests/migrations/app/`) have one version
//! older than every inbox migration and one newer, so the sets interleave.
//! Diesel's harness can only revert an applied version found in the source it
//! is given; `inbox_runtime::migrations::with_inbox` gives it both sets.
//! Nothing here counts the inbox's migrations: the expected versions are read
//! from the sources.
//!
//! Run: `cargo test -p inbox-tests --all-features --test migrations`

#![cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#![allow(missing_docs)]

use diesel::migration::MigrationSource;
use diesel::Connection;
use diesel_migrations::{
    embed_migrations, EmbeddedMigrations, FileBasedMigrations, MigrationError, MigrationHarness,
};
use inbox_runtime::migrations::{
    with_inbox, Combined, DuplicateMigrationVersion, EmbeddedInboxMigrations, InboxMigrations,
};
use inbox_runtime::{claim, Claim, ClaimKey, HandlerName};
use inbox_tests::TestBackend;

/// The application's migrations, embedded.
const APP: EmbeddedMigrations = embed_migrations!("tests/migrations/app");
const APP_OLDER: &str = "20200101000000";
const APP_NEWER: &str = "29990101000000";

type Backend<D> = <<D as TestBackend>::Connection as Connection>::Backend;

/// The same migrations as [`APP`], read from the folder at run time.
fn app_files() -> FileBasedMigrations {
    FileBasedMigrations::from_path(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/migrations/app"))
        .expect("the test's application migrations")
}

/// A source's versions, oldest first.
fn versions<DB: diesel::backend::Backend>(source: &impl MigrationSource<DB>) -> Vec<String> {
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
fn all_versions<DB: EmbeddedInboxMigrations>() -> Vec<String> {
    let mut all = versions::<DB>(&APP);
    all.extend(versions::<DB>(&InboxMigrations));
    all.sort();
    assert_eq!(all.first().map(String::as_str), Some(APP_OLDER));
    assert_eq!(all.last().map(String::as_str), Some(APP_NEWER));
    assert!(all.len() > 2, "the inbox has migrations: {all:?}");
    all
}

fn applied<C, DB>(conn: &mut C) -> Vec<String>
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

fn table_exists(conn: &mut impl Connection, table: &str) -> bool {
    conn.batch_execute(&format!("SELECT 1 FROM {table} WHERE 1 = 0"))
        .is_ok()
}

/// A test database with nothing in it: the harness's inbox table is dropped,
/// so only migrations create tables.
fn empty<D>() -> Option<(D, D::Connection)>
where
    D: TestBackend,
    Backend<D>: EmbeddedInboxMigrations,
{
    let db = D::open()?;
    let mut conn = db.connect();
    inbox_runtime::schema::teardown(&mut conn).expect("drop the harness's inbox table");
    assert!(!table_exists(&mut conn, "inbox_messages"));
    Some((db, conn))
}

/// The inbox table is there and deduplicates.
fn assert_inbox_works<C>(conn: &mut C, id: &str)
where
    C: Connection,
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

fn assert_nothing_left(conn: &mut impl Connection) {
    for table in ["inbox_messages", "app_accounts", "app_ledger"] {
        assert!(!table_exists(conn, table), "{table} is still there");
    }
}

/// Both sets applied the way the README used to suggest (the app's through
/// its own source, the inbox's through `run_pending`): the inbox's source
/// alone cannot revert, the combined one steps back through both, newest
/// first, one migration at a time.
fn revert_last_walks_back_through_both_sets<D>()
where
    D: TestBackend,
    D::Connection: MigrationHarness<Backend<D>>,
    Backend<D>: EmbeddedInboxMigrations,
{
    let Some((_db, mut conn)) = empty::<D>() else {
        return;
    };
    let expected = all_versions::<Backend<D>>();
    assert_eq!(conn.run_pending_migrations(APP).unwrap().len(), 2);
    let inbox = inbox_runtime::migrations::run_pending(&mut conn).expect("the inbox's migrations");
    assert_eq!(inbox, expected.len() - 2);
    assert_eq!(applied(&mut conn), expected);
    assert_inbox_works(&mut conn, "before-revert");

    // The cause: the newest applied version is the app's, which the inbox's
    // source does not contain. Nothing is reverted.
    let error = conn
        .revert_last_migration(<Backend<D> as EmbeddedInboxMigrations>::MIGRATIONS)
        .expect_err("the inbox's source alone cannot revert the app's newest migration");
    assert!(
        matches!(
            error.downcast_ref::<MigrationError>(),
            Some(MigrationError::UnknownMigrationVersion(version)) if version.to_string() == APP_NEWER
        ),
        "{error}"
    );
    assert_eq!(applied(&mut conn), expected);

    let mut reverted = Vec::new();
    while !applied(&mut conn).is_empty() {
        let version = conn
            .revert_last_migration(with_inbox(APP))
            .unwrap_or_else(|error| panic!("revert after {reverted:?}: {error}"));
        reverted.push(version.to_string());
        if reverted.len() == 1 {
            assert!(!table_exists(&mut conn, "app_ledger"));
            assert!(table_exists(&mut conn, "app_accounts"));
            assert_inbox_works(&mut conn, "after-first-revert");
        }
    }
    let mut newest_first = expected;
    newest_first.reverse();
    assert_eq!(reverted, newest_first);
    assert_nothing_left(&mut conn);
}

/// Both sets run through one source, interleaved by version, then reverted
/// together and run again; the app's migrations read from their folder.
fn run_and_revert_all_together<D>()
where
    D: TestBackend,
    D::Connection: MigrationHarness<Backend<D>>,
    Backend<D>: EmbeddedInboxMigrations,
{
    let Some((_db, mut conn)) = empty::<D>() else {
        return;
    };
    let expected = all_versions::<Backend<D>>();
    assert!(conn.has_pending_migration(with_inbox(app_files())).unwrap());
    let ran: Vec<String> = conn
        .run_pending_migrations(with_inbox(app_files()))
        .expect("run both sets")
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(ran, expected, "every migration once, oldest first");
    assert!(!conn.has_pending_migration(with_inbox(app_files())).unwrap());
    assert!(table_exists(&mut conn, "app_accounts") && table_exists(&mut conn, "app_ledger"));
    assert_inbox_works(&mut conn, "m-1");

    let reverted: Vec<String> = conn
        .revert_all_migrations(with_inbox(app_files()))
        .expect("revert both sets")
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut newest_first = expected.clone();
    newest_first.reverse();
    assert_eq!(reverted, newest_first);
    assert!(applied(&mut conn).is_empty());
    assert_nothing_left(&mut conn);

    let again = conn
        .run_pending_migrations(with_inbox(APP))
        .expect("run both sets again")
        .len();
    assert_eq!(again, expected.len());
    // A new inbox: the id claimed before the revert is new again.
    assert_inbox_works(&mut conn, "m-1");
}

/// A version in two combined sources (the inbox's migrations also copied into
/// the app's folder) is refused before anything runs.
fn duplicate_versions_are_refused<D>()
where
    D: TestBackend,
    D::Connection: MigrationHarness<Backend<D>>,
    Backend<D>: EmbeddedInboxMigrations,
{
    let Some((_db, mut conn)) = empty::<D>() else {
        return;
    };
    let inbox = versions::<Backend<D>>(&InboxMigrations);
    let copied_into_app = Combined::new(APP, <Backend<D> as EmbeddedInboxMigrations>::MIGRATIONS);
    let error = conn
        .run_pending_migrations(with_inbox(copied_into_app))
        .expect_err("the inbox's versions twice");
    let duplicate = error
        .downcast_ref::<DuplicateMigrationVersion>()
        .unwrap_or_else(|| panic!("not a DuplicateMigrationVersion: {error}"));
    assert!(inbox.iter().any(|v| v == duplicate.version()), "{error}");
    assert!(error.to_string().contains(duplicate.version()), "{error}");
    let (first, second) = duplicate.names();
    assert_eq!(first, second);
    assert!(first.starts_with(&duplicate.version()[..4]), "{first}");

    assert!(applied(&mut conn).is_empty(), "nothing ran");
    assert_nothing_left(&mut conn);
    let error = conn
        .revert_all_migrations(with_inbox(InboxMigrations))
        .expect_err("refused for reverts too");
    assert!(error.downcast_ref::<DuplicateMigrationVersion>().is_some());
}

macro_rules! backend_tests {
    ($backend:ident, $database:ty) => {
        mod $backend {
            #[test]
            fn revert_last_walks_back_through_both_sets() {
                super::revert_last_walks_back_through_both_sets::<$database>();
            }

            #[test]
            fn run_and_revert_all_together() {
                super::run_and_revert_all_together::<$database>();
            }

            #[test]
            fn duplicate_versions_are_refused() {
                super::duplicate_versions_are_refused::<$database>();
            }
        }
    };
}

#[cfg(feature = "postgres")]
backend_tests!(postgres, inbox_tests::Postgres);
#[cfg(feature = "mysql")]
backend_tests!(mysql, inbox_tests::Mysql);
#[cfg(feature = "sqlite")]
backend_tests!(sqlite, inbox_tests::Sqlite);

/// PostgreSQL's generation layout is a third set: `.and(...)` adds it, and
/// everything reverts together (the layout first, it is the newest inbox set).
#[cfg(feature = "postgres")]
#[test]
fn postgres_partitioned_layout_runs_and_reverts_with_the_rest() {
    use inbox_runtime::prune::partitioned;
    use inbox_tests::Postgres;

    let Some((_db, mut conn)) = empty::<Postgres>() else {
        return;
    };
    let all = || with_inbox(APP).and(partitioned::MIGRATIONS);
    let ran = conn
        .run_pending_migrations(all())
        .expect("run three sets")
        .len();
    let mut expected = all_versions::<diesel::pg::Pg>();
    expected.extend(versions::<diesel::pg::Pg>(&partitioned::MIGRATIONS));
    assert_eq!(ran, expected.len());
    assert!(table_exists(&mut conn, "inbox_generations"));
    assert_inbox_works(&mut conn, "p-1");

    assert_eq!(
        conn.revert_all_migrations(all())
            .expect("revert three sets")
            .len(),
        expected.len()
    );
    assert!(!table_exists(&mut conn, "inbox_generations"));
    assert!(!table_exists(&mut conn, "inbox_messages_archive"));
    assert_nothing_left(&mut conn);
}
