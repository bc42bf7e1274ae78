//! The statements a delivery sends, as Diesel hands them to the server
//! (its instrumentation sees every one, `batch_execute` included): a
//! message that never fails costs what it did before failed attempts were
//! counted (no statement touches `inbox_failures`), and only a failed
//! attempt adds the short transaction that counts it.

use inbox_tests::{statement_shapes as shape, statements_of};

use crate::handlers::apply;
use crate::support::*;

/// A processed message: `BEGIN`, the claim, the body's statement, the
/// commit; a duplicate: `BEGIN`, the claim, the commit. Four and three
/// round trips (each statement is one, MySQL's transaction statements
/// included: see `roundtrips.rs`), and nothing about failures.
pub fn a_message_that_never_fails_sends_the_same_statements<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Msg::new("never-fails");
    let ((), processed) = statements_of(&mut conn, |conn| apply(conn, &msg).expect("processed"));
    assert_eq!(
        shape(&processed),
        ["BEGIN", "claim", "effect", "COMMIT"],
        "a processed message: {processed:#?}"
    );
    let ((), duplicate) = statements_of(&mut conn, |conn| apply(conn, &msg).expect("duplicate"));
    assert_eq!(
        shape(&duplicate),
        ["BEGIN", "claim", "COMMIT"],
        "a duplicate: {duplicate:#?}"
    );
    assert!(
        processed
            .iter()
            .chain(&duplicate)
            .all(|sql| !sql.contains("inbox_failures")),
        "a message that never fails never touches inbox_failures"
    );
}

/// A failed attempt: the handler's transaction rolls back, then one short
/// transaction counts the attempt and checks the limit.
pub fn a_failed_attempt_adds_one_short_transaction<B: E2e>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Msg::with_mode("fails-once", Mode::Fail);
    let ((), failed) = statements_of(&mut conn, |conn| {
        apply(conn, &msg).expect_err("the body fails");
    });
    assert_eq!(
        shape(&failed),
        [
            "BEGIN",
            "claim",
            "effect",
            "ROLLBACK",
            "BEGIN",
            "count attempt",
            "mark dead",
            "COMMIT",
        ],
        "a failed attempt: {failed:#?}"
    );
}

inbox_tests::backend_tests!(
    a_message_that_never_fails_sends_the_same_statements,
    a_failed_attempt_adds_one_short_transaction,
);
