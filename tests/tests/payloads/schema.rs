//! An inbox created before the fingerprint and result columns: handlers
//! without them keep working on it; after `setup()` or the new migration it
//! keeps its claims, which match any fingerprint; reverting the migration
//! drops the columns and keeps the claims.

use diesel::migration::MigrationConnection;
use diesel_migrations::MigrationHarness;
use inbox_runtime::migrations::{EmbeddedInboxMigrations, InboxMigrations};
use inbox_runtime::{AckDecision, InboxError, Outcome, ack_decision};
use inbox_tests::{AppError, DieselBackend, SqlRows, TestBackend};

use crate::handlers::*;
use crate::support::*;

/// The version of the migration that adds the columns.
const COLUMNS_VERSION: &str = "20261206000000";

/// A fresh database whose inbox was created by every migration older than
/// the columns, holding one processed message (`old-1`).
fn old_inbox<B>() -> Option<(B, B::Connection)>
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>> + MigrationConnection,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let (db, mut conn) = fresh::<B>()?;
    inbox_tests::migrate_inbox_before::<B>(&mut conn, COLUMNS_VERSION);
    let old = Transfer::new("old-1", "amount=1");
    let first = transfer_unfingerprinted(&mut conn, &old).expect("processed by the old inbox");
    assert!(first.is_processed());
    Some((db, conn))
}

/// The old inbox: a handler without a fingerprint works as before; one with
/// a fingerprint fails, retryably, until the inbox is upgraded.
fn assert_old_inbox_works<B: TestBackend>(conn: &mut B::Connection) {
    let again = Transfer::new("old-1", "amount=1");
    assert_eq!(
        transfer_unfingerprinted(conn, &again).unwrap(),
        Outcome::Duplicate
    );
    let next = Transfer::new("old-2", "amount=2");
    assert!(transfer_unfingerprinted(conn, &next).unwrap() == Outcome::Processed(()));
    let early = transfer(conn, &Transfer::new("old-3", "amount=3"));
    match &early {
        Err(AppError::Db(error)) => assert!(inbox_runtime::recovery(error).is_retryable()),
        other => panic!("a database error expected before the upgrade: {other:?}"),
    }
    assert_eq!(claims(conn, TRANSFER, "old-3"), 0);
    // Storing a result fails too: the inbox's own step, not a failed
    // attempt of the body (never dead, however often). On PostgreSQL the
    // claim itself reads the stored result of a claim it meets, and fails
    // before the body; elsewhere the body runs and its result's write
    // fails.
    let body_runs = match B::NAME {
        "postgres" => 0,
        _ => 1,
    };
    for _ in 0..3 {
        let storing = Charge::new("old-4", 4);
        let result = receipt_only(conn, &storing);
        match &result {
            Err(AppError::Db(error)) => assert!(inbox_runtime::recovery(error).is_retryable()),
            other => panic!("a database error expected before the upgrade: {other:?}"),
        }
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        assert_eq!(storing.runs(), body_runs, "the body's runs");
    }
    assert_eq!(claims(conn, "payloads.receipt", "old-4"), 0);
    assert_eq!(applied(conn, "old-4"), Vec::<String>::new(), "rolled back");
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_failures"),
        0,
        "no failed attempt counted"
    );
}

/// After the upgrade: the old claims kept and matching any payload; new
/// claims checked.
fn assert_upgraded<B: TestBackend>(conn: &mut B::Connection) {
    for id in ["old-1", "old-2"] {
        let later = Transfer::new(id, "amount=999");
        assert_eq!(transfer(conn, &later).unwrap(), Outcome::Duplicate, "{id}");
        assert_eq!(later.runs(), 0);
    }
    assert_eq!(
        transfer(conn, &Transfer::new("old-3", "amount=3")).unwrap(),
        Outcome::Processed(())
    );
    let conflict = transfer(conn, &Transfer::new("old-3", "amount=4"));
    assert!(
        matches!(conflict, Err(AppError::Inbox(InboxError::Conflict(_)))),
        "{conflict:?}"
    );
    let first = charge(conn, &Charge::new("new-1", 10)).unwrap();
    assert!(first.is_processed());
    assert!(
        charge(conn, &Charge::new("new-1", 10))
            .unwrap()
            .is_replayed()
    );
}

pub fn setup_adds_the_columns_to_an_old_inbox<B>()
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>> + MigrationConnection,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let Some((_db, mut conn)) = old_inbox::<B>() else {
        return;
    };
    assert_old_inbox_works::<B>(&mut conn);
    inbox_runtime::setup(&mut conn).expect("setup upgrades the inbox");
    inbox_runtime::setup(&mut conn).expect("and runs again harmlessly");
    assert_upgraded::<B>(&mut conn);
}

pub fn the_columns_migration_upgrades_an_old_inbox_and_reverts<B>()
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>> + MigrationConnection,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let Some((_db, mut conn)) = old_inbox::<B>() else {
        return;
    };
    assert_old_inbox_works::<B>(&mut conn);
    let since = inbox_tests::inbox_migrations_since::<B>(COLUMNS_VERSION);
    let ran = inbox_runtime::migrations::run_pending(&mut conn).expect("the new migrations");
    assert_eq!(
        ran,
        since.len(),
        "the columns migration, and those after it"
    );
    assert_upgraded::<B>(&mut conn);

    for version in since {
        let reverted = conn
            .revert_last_migration(InboxMigrations)
            .expect("revert the columns migration and those after it, newest first");
        assert_eq!(reverted.to_string(), version);
    }
    for id in ["old-1", "old-3", "new-1"] {
        assert_eq!(
            claims(&mut conn, if id == "new-1" { CHARGE } else { TRANSFER }, id),
            1
        );
    }
    let later = Transfer::new("old-3", "amount=3");
    assert_eq!(
        transfer_unfingerprinted(&mut conn, &later).unwrap(),
        Outcome::Duplicate
    );
}

inbox_tests::backend_tests!(
    setup_adds_the_columns_to_an_old_inbox,
    the_columns_migration_upgrades_an_old_inbox_and_reverts,
);
