//! `inbox_runtime::testing` against real databases: a correct handler
//! passes, and each mistake it exists for is caught as its own
//! `IdempotenceViolation` — a write through a second connection (the
//! probe), a handler without `#[idempotent]`, a write around the handler
//! on the duplicate path (a new row, or a value changed in place), an id
//! that differs per delivery — plus the table selection, a connection
//! inside a transaction. (The guide's example, `docs/src/testing.md`, runs
//! as a doctest of `inbox_tests::guide`.)
//!
//! Every test is a generic function over the backend, instantiated by
//! `inbox_tests::backend_tests!` on PostgreSQL, MariaDB/MySQL and SQLite,
//! so names read `postgres::a_second_connection_is_caught`; the async
//! check (`check_idempotent_async`) on PostgreSQL and MariaDB/MySQL's
//! diesel-async connections, named `asynchronous::postgres::…`.
//!
//! Run: `INBOX_REQUIRE_DATABASES=1 cargo test -p inbox-tests --all-features --test testing`

#![allow(missing_docs)]

#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
mod asynchronous;
mod handlers;

use diesel::Connection;
use inbox_runtime::testing::{
    Delivery, DigestBackend, Idempotence, IdempotenceViolation, TableChange, assert_idempotent,
    check_idempotent, check_idempotent_in_tables,
};
use inbox_tests::{DieselBackend, SqlRows, TestBackend};

use crate::handlers::*;

/// A fresh database with the suite's tables, and a connection to it.
fn fresh<B: TestBackend>() -> Option<(B, B::Connection)> {
    B::open_with_effects(TABLES_DDL)
}

fn balance(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT balance AS value FROM testing_accounts WHERE id = 1")
}

fn audits(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM testing_audit")
}

fn claims(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages")
}

fn change(table: &str, before: i64, after: i64) -> TableChange {
    TableChange {
        table: table.to_owned(),
        rows_before: Some(before),
        rows_after: Some(after),
    }
}

/// (a) A correct handler passes, every table compared; the check's
/// deliveries committed once (the probe's was rolled back).
fn a_correct_handler_passes<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Payment::new("pay-1", 250);
    let report = assert_idempotent(&mut conn, |conn| credit(conn, &msg));
    assert_eq!(report.claims, 1);
    assert_eq!(
        report.tables,
        [
            "inbox_failures",
            "inbox_messages",
            "inbox_outbox",
            "inbox_outbox_keys",
            "testing_accounts",
            "testing_audit"
        ],
        "every table of the schema or database, Diesel's migrations table left out"
    );
    assert_eq!(balance(&mut conn), 250, "processed once, probe rolled back");
    assert_eq!(audits(&mut conn), 1);
    assert_eq!(claims(&mut conn), 1);
}

/// (a) An `Outcome<T>` handler passes too: the claim row, not the value,
/// tells a processed delivery.
fn an_outcome_handler_passes<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Payment::new("pay-1", 40);
    let report = check_idempotent(&mut conn, |conn| credit_valued(conn, &msg))
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.claims, 1);
    assert_eq!(balance(&mut conn), 40);
}

/// (b) A handler that writes through a second connection: on a server the
/// write survives the probe's rollback; on SQLite it waits for the probe's
/// write lock and fails with `database is locked`.
fn a_second_connection_is_caught<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut outside = db.connect();
    if B::NAME == "sqlite" {
        // Fail fast instead of after the harness's 10 s.
        diesel::connection::SimpleConnection::batch_execute(
            &mut outside,
            "PRAGMA busy_timeout = 100",
        )
        .expect("shorten the busy timeout");
    }
    let msg = Payment::new("pay-1", 250);
    let violation = check_idempotent(&mut conn, |conn| {
        credit_auditing_outside(conn, &mut outside, &msg)
    })
    .expect_err("a write through a second connection must be caught");
    if B::NAME == "sqlite" {
        match &violation {
            IdempotenceViolation::DeliveryFailed {
                delivery: Delivery::Probe,
                error,
            } => assert!(error.contains("database is locked"), "{error}"),
            other => panic!("expected DeliveryFailed in the probe, got {other:?}"),
        }
        let text = violation.to_string();
        assert!(text.contains("second connection"), "{text}");
        assert_eq!(audits(&mut conn), 0, "the outside write failed");
    } else {
        match &violation {
            IdempotenceViolation::WroteOutsideTransaction { tables } => {
                assert_eq!(tables, &[change("testing_audit", 0, 1)]);
            }
            other => panic!("expected WroteOutsideTransaction, got {other:?}"),
        }
        let text = violation.to_string();
        assert!(
            text.starts_with("`testing_audit` (0 rows before, 1 after) changed although"),
            "{text}"
        );
        assert!(text.contains("second connection or a pool"), "{text}");
        assert_eq!(audits(&mut conn), 1, "the outside write survived the probe");
    }
    assert_eq!(
        balance(&mut conn),
        0,
        "the probe's own write was rolled back"
    );
    assert_eq!(claims(&mut conn), 0, "the probe's claim was rolled back");
}

/// (c) A plain function (no `#[idempotent]`) claims nothing: not processed.
fn an_unannotated_handler_is_caught<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Payment::new("pay-1", 250);
    let violation = check_idempotent(&mut conn, |conn| credit_unguarded(conn, &msg))
        .expect_err("a handler without the inbox must be caught");
    assert!(
        matches!(
            violation,
            IdempotenceViolation::NotProcessed { new_claims: 0 }
        ),
        "{violation:?}"
    );
    assert!(
        violation.to_string().contains("#[idempotent"),
        "{violation}"
    );
    assert_eq!(balance(&mut conn), 250, "the first delivery's effect");
}

/// (d) A write after the handler, on every delivery: the duplicate adds a
/// row to `testing_audit`.
fn a_write_on_the_duplicate_path_is_caught<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Payment::new("pay-1", 250);
    let violation = check_idempotent(&mut conn, |conn| credit_then_audit(conn, &msg))
        .expect_err("a write on the duplicate path must be caught");
    match &violation {
        IdempotenceViolation::ChangedOnDuplicate { tables } => {
            assert_eq!(tables, &[change("testing_audit", 2, 3)]);
        }
        other => panic!("expected ChangedOnDuplicate, got {other:?}"),
    }
    let text = violation.to_string();
    assert!(
        text.starts_with(
            "the second delivery of the same message changed `testing_audit` (2 rows before, 3 after)"
        ),
        "{text}"
    );
    assert_eq!(balance(&mut conn), 250, "the handler itself credited once");
}

/// (d) The same with no row added: a value changed in place (`NULL` to
/// `''`) is seen through the rows' hash, not their count.
fn an_update_in_place_on_the_duplicate_path_is_caught<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Payment::new("pay-1", 250);
    let violation = check_idempotent(&mut conn, |conn| credit_then_toggle_note(conn, &msg))
        .expect_err("an update on the duplicate path must be caught");
    match &violation {
        IdempotenceViolation::ChangedOnDuplicate { tables } => {
            assert_eq!(tables, &[change("testing_accounts", 1, 1)]);
        }
        other => panic!("expected ChangedOnDuplicate, got {other:?}"),
    }
    assert!(
        violation
            .to_string()
            .contains("`testing_accounts` (1 row, contents changed)"),
        "{violation}"
    );
}

/// The same, in a table with a column named `t`: every column of a row
/// is compared, whatever the columns are called.
fn a_change_beside_a_column_named_t_is_caught<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    diesel::connection::SimpleConnection::batch_execute(&mut conn, TALLY_DDL)
        .expect("the tally table");
    let msg = Payment::new("pay-1", 250);
    let violation = check_idempotent(&mut conn, |conn| credit_then_tally(conn, &msg))
        .expect_err("an update on the duplicate path must be caught");
    match &violation {
        IdempotenceViolation::ChangedOnDuplicate { tables } => {
            assert_eq!(tables, &[change("testing_tally", 1, 1)]);
        }
        other => panic!("expected ChangedOnDuplicate, got {other:?}"),
    }
}

/// An id that differs per delivery: the second delivery claims again.
fn an_id_that_changes_per_delivery_is_caught<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut deliveries = 0;
    let violation = check_idempotent(&mut conn, |conn| {
        deliveries += 1;
        credit(conn, &Payment::new(&format!("delivery-{deliveries}"), 1))
    })
    .expect_err("a per-delivery id must be caught");
    assert!(
        matches!(
            violation,
            IdempotenceViolation::NotDuplicate { new_claims: 1 }
        ),
        "{violation:?}"
    );
}

/// Named tables: only those are compared (the claim is still counted), so
/// the duplicate path's audit row passes unseen when `testing_audit` is not
/// named, and is caught when it is; a table that does not exist is an error.
fn named_tables_are_the_ones_compared<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Payment::new("pay-1", 250);
    let report = check_idempotent_in_tables(&mut conn, &["testing_accounts"], |conn| {
        credit_then_audit(conn, &msg)
    })
    .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.tables, ["testing_accounts"]);

    let msg = Payment::new("pay-2", 250);
    let violation = Idempotence::new()
        .tables(["testing_audit", "testing_accounts", "testing_audit"])
        .check(&mut conn, |conn| credit_then_audit(conn, &msg))
        .expect_err("the named table changed");
    match &violation {
        IdempotenceViolation::ChangedOnDuplicate { tables } => {
            assert_eq!(tables, &[change("testing_audit", 5, 6)]);
        }
        other => panic!("expected ChangedOnDuplicate, got {other:?}"),
    }

    let msg = Payment::new("pay-3", 250);
    let violation =
        check_idempotent_in_tables(&mut conn, &["no_such_table"], |conn| credit(conn, &msg))
            .expect_err("no such table");
    assert!(
        matches!(&violation, IdempotenceViolation::Database { during, .. } if during.contains("no_such_table")),
        "{violation:?}"
    );
}

/// Inside a transaction (a test transaction), the check refuses to run:
/// its probe needs the outermost transaction, its deliveries must commit.
fn a_connection_inside_a_transaction_is_refused<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    conn.begin_test_transaction()
        .expect("begin a test transaction");
    let msg = Payment::new("pay-1", 250);
    let violation =
        check_idempotent(&mut conn, |conn| credit(conn, &msg)).expect_err("inside a transaction");
    assert!(
        matches!(
            violation,
            IdempotenceViolation::TransactionOpen { depth: 1 }
        ),
        "{violation:?}"
    );
    assert_eq!(balance(&mut conn), 0, "nothing delivered");
}

/// A failing delivery is reported as such, with its error (here it fails
/// in the probe already, the first delivery the check makes).
fn a_failing_delivery_is_reported<B: TestBackend>()
where
    DieselBackend<B>: DigestBackend,
{
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let violation = check_idempotent(&mut conn, |_: &mut B::Connection| {
        Err::<(), _>(inbox_tests::AppError::Failed("the account is frozen"))
    })
    .expect_err("the delivery fails");
    match &violation {
        IdempotenceViolation::DeliveryFailed {
            delivery: Delivery::Probe,
            error,
        } => assert!(error.contains("the account is frozen"), "{error}"),
        other => panic!("expected DeliveryFailed, got {other:?}"),
    }
}

inbox_tests::backend_tests!(
    a_correct_handler_passes,
    an_outcome_handler_passes,
    a_second_connection_is_caught,
    an_unannotated_handler_is_caught,
    a_write_on_the_duplicate_path_is_caught,
    an_update_in_place_on_the_duplicate_path_is_caught,
    a_change_beside_a_column_named_t_is_caught,
    an_id_that_changes_per_delivery_is_caught,
    named_tables_are_the_ones_compared,
    a_connection_inside_a_transaction_is_refused,
    a_failing_delivery_is_reported,
);
