//! A panicking body: counted after the rollback, with the panic's message;
//! the panic is resumed, also at the limit; at every depth of nested
//! transactions in the body.

use std::panic::{AssertUnwindSafe, catch_unwind};

use diesel::connection::LoadConnection;
use inbox_runtime::AckDecision;
use inbox_tests::TestBackend;

use crate::handlers::*;
use crate::support::*;

use inbox_tests::transaction_depth as depth;

/// Delivers `msg` to `three`, which must panic; returns the panic's text.
fn expect_panic<C: LoadConnection<Backend: inbox_runtime::InboxBackend>>(
    conn: &mut C,
    msg: &Msg,
) -> String {
    match catch_unwind(AssertUnwindSafe(|| three(conn, msg))) {
        Err(payload) => panic_text(&*payload),
        Ok(returned) => panic!("the panic became a return value: {returned:?}"),
    }
}

pub fn a_panic_is_counted_and_resumed<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for attempt in 1..=3 {
        let msg = Msg::panicking("p-1", &format!("boom {attempt}"));
        let text = expect_panic(&mut conn, &msg);
        assert_eq!(text, format!("deliberate panic: boom {attempt}"), "resumed");
        assert_eq!(depth(&mut conn), 0, "no transaction left open");
        assert_eq!(effects(&mut observer, "p-1"), 0);
        let last_error = format!("the handler panicked: deliberate panic: boom {attempt}");
        if attempt < 3 {
            assert_eq!(
                failure_row::<B>(&mut observer, THREE, "p-1"),
                counted(attempt, &last_error)
            );
            assert_eq!(claims(&mut observer, THREE, "p-1"), 0);
        } else {
            assert_eq!(
                failure_row::<B>(&mut observer, THREE, "p-1"),
                exhausted(3, &last_error),
                "the panic at the limit is resumed, and the message is dead"
            );
            assert_eq!(claims(&mut observer, THREE, "p-1"), 1);
        }
    }
    let later = Msg::panicking("p-1", "never runs");
    let result = three(&mut conn, &later);
    assert!(result.is_ok(), "a duplicate: {result:?}");
    assert_eq!(inbox_runtime::ack_decision(&result), AckDecision::Ack);
    assert_eq!(later.runs(), 0);
}

/// Failures and panics count alike: fail, panic, fail is dead at three,
/// with the last error's text.
pub fn failures_and_panics_count_together<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let result = three(&mut conn, &Msg::failing("p-2", "boom 1"));
    assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    expect_panic(&mut conn, &Msg::panicking("p-2", "boom 2"));
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "p-2"),
        counted(2, "the handler panicked: deliberate panic: boom 2")
    );
    let result = three(&mut conn, &Msg::failing("p-2", "boom 3"));
    assert!(
        matches!(
            result.as_ref().map_err(AppError::inbox),
            Err(Some(inbox_runtime::InboxError::AttemptsExhausted {
                attempts: 3,
                ..
            }))
        ),
        "{result:?}"
    );
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "p-2"),
        exhausted(3, "boom 3")
    );
}

/// A panic inside one and inside two nested `conn.transaction`s of the
/// body: everything rolls back, the connection is back at depth 0, the
/// attempt is counted, and the third is fatal.
pub fn a_panic_inside_nested_transactions_is_counted<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for nesting in 1..=2 {
        let id = format!("p-nested-{nesting}");
        for attempt in 1..=3 {
            let msg = Msg::new(&id, Act::PanicAtDepth(nesting));
            let text = expect_panic(&mut conn, &msg);
            assert_eq!(text, "deliberate panic inside a nested transaction");
            assert_eq!(depth(&mut conn), 0, "back at depth 0");
            assert_eq!(effects(&mut observer, &id), 0, "every level rolled back");
            let row = failure_row::<B>(&mut observer, THREE, &id).expect("counted");
            assert_eq!(row.attempts, attempt);
            assert_eq!(
                row.last_error,
                "the handler panicked: deliberate panic inside a nested transaction"
            );
            assert_eq!(row.dead, attempt == 3);
        }
        assert_eq!(claims(&mut observer, THREE, &id), 1);
        let later = Msg::new(&id, Act::PanicAtDepth(nesting));
        assert!(three(&mut conn, &later).is_ok());
        assert_eq!(later.runs(), 0);
    }
    // The connection still commits.
    three(&mut conn, &Msg::succeeding("p-after")).expect("processed");
    assert_eq!(effects(&mut observer, "p-after"), 1);
}

inbox_tests::backend_tests!(
    a_panic_is_counted_and_resumed,
    failures_and_panics_count_together,
    a_panic_inside_nested_transactions_is_counted,
);
