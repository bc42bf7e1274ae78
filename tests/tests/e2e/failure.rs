//! Failure paths that must never lose an acknowledged effect, on every
//! backend: a panic at any depth of the body (inside a Diesel transaction the
//! body opened), with and without a transaction of the caller's around the
//! handler.

use diesel::prelude::*;
use inbox_runtime::Outcome;

use crate::handlers::*;
use crate::support::*;

/// Runs `deliver`, which must panic with a `DeliberatePanic`.
fn expect_deliberate_panic<T: std::fmt::Debug>(deliver: impl FnOnce() -> T) {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(deliver)) {
        Err(payload) => assert!(
            payload.downcast_ref::<DeliberatePanic>().is_some(),
            "the body's own panic is resumed"
        ),
        Ok(returned) => panic!("the panic became a return value: {returned:?}"),
    }
}

use inbox_tests::transaction_depth as depth;

pub fn panic_inside_a_nested_transaction_rolls_back_the_handler<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let doomed = Msg::with_mode("np-1", Mode::Panic);
    expect_deliberate_panic(|| nested_transaction(&mut conn, &doomed));
    assert_eq!(depth(&mut conn), 0, "the handler's transaction is closed");
    assert_connection_usable(&mut conn);

    let mut other = db.connect();
    assert_eq!(other.inbox_rows(), NO_ROWS, "the claim rolled back");
    assert_eq!(other.all_effects(), NO_EFFECTS, "every effect rolled back");

    // The next delivery on the same connection commits for real
    // (before the fix it ran inside the abandoned transaction and
    // reported success for work that was never committed).
    let next = Msg::new("np-2");
    apply(&mut conn, &next).expect("the next delivery");
    assert_eq!(other.inbox_count(APPLY, "np-2"), 1, "committed");
    assert_eq!(other.effects_by(APPLY, "np-2"), 1, "committed");

    // The panicked message is processed on its redelivery, once.
    let redelivery = Msg::new("np-1");
    nested_transaction(&mut conn, &redelivery).expect("the redelivery");
    assert_eq!(redelivery.runs.get(), 1);
    assert_eq!(
        other.effects_by(NESTED, "np-1"),
        2,
        "both of its effects, once"
    );
    let duplicate = Msg::new("np-1");
    nested_transaction(&mut conn, &duplicate).expect("a duplicate");
    assert_eq!(duplicate.runs.get(), 0);
}

pub fn panic_inside_a_nested_transaction_returns_to_the_callers_level<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let doomed = Msg::with_mode("np-3", Mode::Panic);
    conn.transaction(|conn| {
        conn.record_effect("outer", "outer", 0, "before")?;
        expect_deliberate_panic(|| nested_transaction(conn, &doomed));
        assert_eq!(depth(conn), 1, "back at the caller's transaction");
        conn.record_effect("outer", "outer", 0, "after")?;
        Ok::<_, AppError>(())
    })
    .expect("the caller's transaction commits");
    assert_connection_usable(&mut conn);

    let mut other = db.connect();
    assert_eq!(
        other.inbox_rows(),
        NO_ROWS,
        "the handler's claim rolled back"
    );
    assert_eq!(
        other.all_effects(),
        vec![
            ("outer".to_owned(), "outer".to_owned(), "after".to_owned()),
            ("outer".to_owned(), "outer".to_owned(), "before".to_owned()),
        ],
        "the caller's work committed, the handler's did not"
    );
}

pub fn nested_transaction_that_succeeds_commits_with_the_handler<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let fine = Msg::new("np-4");
    nested_transaction(&mut conn, &fine).expect("processed");
    assert_connection_usable(&mut conn);
    let mut other = db.connect();
    assert_eq!(other.effects_by(NESTED, "np-4"), 2);
    assert_eq!(other.inbox_count(NESTED, "np-4"), 1);
}

/// A body that ignores a failed statement and returns `Ok`: on PostgreSQL the
/// transaction is aborted, so nothing can commit and the handler must say so
/// (PostgreSQL answers `COMMIT` with a silent `ROLLBACK`); elsewhere the
/// failed statement is undone alone and the rest commits.
pub fn ignored_failed_statement_never_reports_uncommitted_work_as_done<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut other = db.connect();
    let swallowing = Msg::with_mode("sw-1", Mode::DbErrorWithQuestionMark);
    let result = swallows_a_failure(&mut conn, &swallowing);
    assert_connection_usable(&mut conn);
    if B::FAILED_STATEMENT_ABORTS_TRANSACTION {
        let error = result.expect_err("uncommitted work must not be reported as done");
        let inbox = error.inbox().expect("an inbox error");
        assert!(
            matches!(
                inbox,
                inbox_runtime::InboxError::IgnoredStatementFailure { .. }
            ),
            "{inbox:?}"
        );
        assert_eq!(inbox.recovery(), inbox_runtime::Recovery::Retry);
        assert_eq!(other.inbox_rows(), NO_ROWS);
        assert_eq!(other.all_effects(), NO_EFFECTS);
        // The redelivery processes.
        let redelivery = Msg::new("sw-1");
        assert_eq!(
            swallows_a_failure(&mut conn, &redelivery).expect("redelivery"),
            Outcome::Processed(())
        );
    } else {
        assert_eq!(result.expect("committed"), Outcome::Processed(()));
    }
    assert_eq!(other.inbox_count(SWALLOW, "sw-1"), 1);
    assert_eq!(other.effects_by(SWALLOW, "sw-1"), 2, "both effects, once");
    let duplicate = Msg::new("sw-1");
    assert_eq!(
        swallows_a_failure(&mut conn, &duplicate).expect("duplicate"),
        Outcome::Duplicate
    );
}

pub fn ignored_failed_statement_in_a_nested_handler_spares_the_callers_work<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let swallowing = Msg::with_mode("sw-2", Mode::DbErrorWithQuestionMark);
    conn.transaction(|conn| {
        conn.record_effect("outer", "outer", 0, "before")?;
        let result = swallows_a_failure(conn, &swallowing);
        if B::FAILED_STATEMENT_ABORTS_TRANSACTION {
            let error = result.expect_err("the handler's savepoint could not commit");
            assert!(
                matches!(
                    error.inbox(),
                    Some(inbox_runtime::InboxError::IgnoredStatementFailure { .. })
                ),
                "{error:?}"
            );
        } else {
            assert_eq!(
                result.expect("committed with the caller"),
                Outcome::Processed(())
            );
        }
        // The caller's transaction is healthy again either way.
        conn.record_effect("outer", "outer", 0, "after")?;
        Ok::<_, AppError>(())
    })
    .expect("the caller's transaction commits");
    assert_connection_usable(&mut conn);
    let mut other = db.connect();
    assert_eq!(other.effects_by("outer", "outer"), 2);
    let handler_effects = if B::FAILED_STATEMENT_ABORTS_TRANSACTION {
        0
    } else {
        2
    };
    assert_eq!(other.effects_by(SWALLOW, "sw-2"), handler_effects);
    assert_eq!(other.inbox_count(SWALLOW, "sw-2"), handler_effects / 2);
}

inbox_tests::backend_tests!(
    panic_inside_a_nested_transaction_rolls_back_the_handler,
    panic_inside_a_nested_transaction_returns_to_the_callers_level,
    nested_transaction_that_succeeds_commits_with_the_handler,
    ignored_failed_statement_never_reports_uncommitted_work_as_done,
    ignored_failed_statement_in_a_nested_handler_spares_the_callers_work,
);
