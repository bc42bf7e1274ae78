//! An inbox created by the migrations before `inbox_failures` existed:
//! it keeps working as it is (a failure's count is lost, a rejection is
//! retried), and after `setup()` or the new migration it keeps its claims
//! and counts failures. Reverting the migration drops the table alone.

use diesel::Connection;
use diesel::migration::MigrationConnection;
use diesel_migrations::MigrationHarness;
use inbox_runtime::migrations::{EmbeddedInboxMigrations, InboxMigrations};
use inbox_runtime::{AckDecision, InboxError, ack_decision};
use inbox_tests::{DieselBackend, TestBackend};

use crate::handlers::*;
use crate::support::*;

/// The version of the migration that adds `inbox_failures`.
const FAILURES_VERSION: &str = "20261205000000";

fn has_failures_table(conn: &mut impl Connection) -> bool {
    conn.batch_execute("SELECT 1 FROM inbox_failures WHERE 1 = 0")
        .is_ok()
}

/// A fresh database whose inbox was created by every migration older than
/// the failures one, holding one processed message (`old-1`).
fn old_inbox<B>() -> Option<(B, B::Connection)>
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>> + MigrationConnection,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let (db, mut conn) = fresh::<B>()?;
    inbox_tests::migrate_inbox_before::<B>(&mut conn, FAILURES_VERSION);
    assert!(!has_failures_table(&mut conn));
    three(&mut conn, &Msg::succeeding("old-1")).expect("processed by the old inbox");
    Some((db, conn))
}

/// What the old inbox does with failures: the body's error, nothing
/// recorded, the connection still usable; a rejection that cannot be
/// recorded is retried.
fn assert_old_inbox_works<B: TestBackend>(conn: &mut B::Connection, observer: &mut B::Connection) {
    let result = three(conn, &Msg::failing("old-2", "boom"));
    assert!(
        matches!(&result, Err(AppError::Failed(text)) if text == "boom"),
        "{result:?}"
    );
    assert_eq!(ack_decision(&result), AckDecision::Retry);
    let result = three(conn, &Msg::rejecting("old-3", "bad"));
    assert!(
        !matches!(
            &result,
            Err(AppError::Inbox(InboxError::Rejected { .. })) | Ok(_)
        ),
        "a rejection that could not be recorded: {result:?}"
    );
    assert_eq!(ack_decision(&result), AckDecision::Retry);
    assert_eq!(claims(observer, THREE, "old-3"), 0);
    let duplicate = Msg::succeeding("old-1");
    three(conn, &duplicate).unwrap();
    assert_eq!(duplicate.runs(), 0);
    three(conn, &Msg::succeeding("old-4")).expect("still processes");
}

/// After the upgrade: the old claims kept, failures counted to the limit.
fn assert_upgraded<B: TestBackend>(conn: &mut B::Connection, observer: &mut B::Connection) {
    assert!(has_failures_table(conn));
    for id in ["old-1", "old-4"] {
        assert_eq!(claims(observer, THREE, id), 1, "{id} kept");
        let duplicate = Msg::succeeding(id);
        three(conn, &duplicate).unwrap();
        assert_eq!(duplicate.runs(), 0);
    }
    for attempt in 1..=3 {
        let _ = three(conn, &Msg::failing("new-1", &format!("boom {attempt}")));
    }
    assert_eq!(
        failure_row::<B>(observer, THREE, "new-1"),
        exhausted(3, "boom 3")
    );
    let result = three(conn, &Msg::rejecting("old-3", "bad"));
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(
        failure_row::<B>(observer, THREE, "old-3"),
        rejected(1, "bad")
    );
}

pub fn setup_adds_inbox_failures_to_an_old_inbox<B>()
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>> + MigrationConnection,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let Some((db, mut conn)) = old_inbox::<B>() else {
        return;
    };
    let mut observer = db.connect();
    assert_old_inbox_works::<B>(&mut conn, &mut observer);
    inbox_runtime::setup(&mut conn).expect("setup upgrades the inbox");
    inbox_runtime::setup(&mut conn).expect("and runs again harmlessly");
    assert_upgraded::<B>(&mut conn, &mut observer);
}

pub fn the_failures_migration_upgrades_an_old_inbox_and_reverts<B>()
where
    B: TestBackend,
    B::Connection: MigrationHarness<DieselBackend<B>> + MigrationConnection,
    DieselBackend<B>: EmbeddedInboxMigrations,
{
    let Some((db, mut conn)) = old_inbox::<B>() else {
        return;
    };
    let mut observer = db.connect();
    assert_old_inbox_works::<B>(&mut conn, &mut observer);
    let since = inbox_tests::inbox_migrations_since::<B>(FAILURES_VERSION);
    let ran = inbox_runtime::migrations::run_pending(&mut conn).expect("the new migrations");
    assert_eq!(
        ran,
        since.len(),
        "the failures migration, and those after it"
    );
    assert_upgraded::<B>(&mut conn, &mut observer);

    for version in since {
        let reverted = conn
            .revert_last_migration(InboxMigrations)
            .expect("revert the failures migration and those after it, newest first");
        assert_eq!(reverted.to_string(), version);
    }
    assert!(!has_failures_table(&mut conn));
    assert_eq!(claims(&mut observer, THREE, "old-1"), 1, "claims kept");
    assert_eq!(
        claims(&mut observer, THREE, "new-1"),
        1,
        "the dead claim too"
    );
    let duplicate = Msg::succeeding("new-1");
    three(&mut conn, &duplicate).unwrap();
    assert_eq!(duplicate.runs(), 0);
}

inbox_tests::backend_tests!(
    setup_adds_inbox_failures_to_an_old_inbox,
    the_failures_migration_upgrades_an_old_inbox_and_reverts,
);
