//! The application's migrations and the inbox's, run and reverted together
//! on every backend.

use diesel_migrations::{MigrationError, MigrationHarness};
use inbox_runtime::migrations::{
    Combined, DuplicateMigrationVersion, EmbeddedInboxMigrations, InboxMigrations, with_inbox,
};
use inbox_tests::{DieselBackend, TestBackend};

use crate::support::*;

/// Both sets applied the way the README used to suggest (the app's through
/// its own source, the inbox's through `run_pending`): the inbox's source
/// alone cannot revert, the combined one steps back through both, newest
/// first, one migration at a time.
pub fn revert_last_walks_back_through_both_sets<B>()
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>>,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let Some((_db, mut conn)) = empty::<B>() else {
        return;
    };
    let expected = all_versions::<DieselBackend<B>>();
    assert_eq!(conn.run_pending_migrations(APP).unwrap().len(), 2);
    let inbox = inbox_runtime::migrations::run_pending(&mut conn).expect("the inbox's migrations");
    assert_eq!(inbox, expected.len() - 2);
    assert_eq!(applied(&mut conn), expected);
    assert_inbox_works(&mut conn, "before-revert");

    // The cause: the newest applied version is the app's, which the inbox's
    // source does not contain. Nothing is reverted.
    let error = conn
        .revert_last_migration(<DieselBackend<B> as EmbeddedInboxMigrations>::MIGRATIONS)
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
pub fn run_and_revert_all_together<B>()
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>>,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let Some((_db, mut conn)) = empty::<B>() else {
        return;
    };
    let expected = all_versions::<DieselBackend<B>>();
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
pub fn duplicate_versions_are_refused<B>()
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>>,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let Some((_db, mut conn)) = empty::<B>() else {
        return;
    };
    let inbox = versions::<DieselBackend<B>>(&InboxMigrations);
    let copied_into_app = Combined::new(
        APP,
        <DieselBackend<B> as EmbeddedInboxMigrations>::MIGRATIONS,
    );
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

inbox_tests::backend_tests!(
    revert_last_walks_back_through_both_sets,
    run_and_revert_all_together,
    duplicate_versions_are_refused,
);
