//! A constraint the server checks at `COMMIT` (a deferred foreign key) and
//! the message's effect violates. Every delivery of the message fails the
//! same way: the refused `COMMIT` is the message's failed attempt, counted
//! after the rollback like a failed body, and the message is dead after its
//! limit, instead of being retried (or reconnected) forever. The connection
//! stays usable. PostgreSQL and SQLite; MariaDB/MySQL check foreign keys at
//! each statement, where a violation is already a failed body.

use inbox_runtime::{AckDecision, InboxError, ack_decision};
use inbox_tests::{
    COUNT_CHILDREN_SQL, ORPHAN_SQL, SqlRows, TestBackend, create_deferred_foreign_key,
};

use crate::handlers::*;
use crate::support::*;

pub fn a_constraint_refused_at_commit_is_a_counted_attempt<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    create_deferred_foreign_key::<B>(&mut conn);
    let mut observer = db.connect();
    for attempt in 1..=3 {
        let msg = Scripted::new("rc-1", vec![Step::Sql(ORPHAN_SQL.to_owned())]);
        let result = scripted(&mut conn, &msg);
        assert_eq!(msg.runs(), 1, "the body ran");
        let error = result.as_ref().expect_err("the COMMIT is refused");
        if attempt < 3 {
            assert_eq!(ack_decision(&result), AckDecision::Retry, "{error:?}");
            let row = failure_row::<B>(&mut observer, SCRIPTED, "rc-1")
                .unwrap_or_else(|| panic!("attempt {attempt} was not counted: {error:?}"));
            assert_eq!((row.attempts, row.dead), (attempt, false), "{row:?}");
        } else {
            assert!(
                matches!(
                    error.inbox(),
                    Some(InboxError::AttemptsExhausted { attempts: 3, .. })
                ),
                "{error:?}"
            );
            assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
            let row = failure_row::<B>(&mut observer, SCRIPTED, "rc-1").expect("counted");
            assert_eq!((row.attempts, row.dead), (3, true), "{row:?}");
        }
        assert_eq!(effects(&mut observer, "rc-1"), 0, "rolled back");
        assert_eq!(observer.bigint(COUNT_CHILDREN_SQL), 0);
    }
    // Dead: the next delivery is a duplicate, its body does not run.
    let later = Scripted::new("rc-1", vec![Step::Sql(ORPHAN_SQL.to_owned())]);
    assert!(scripted(&mut conn, &later).is_ok());
    assert_eq!(later.runs(), 0);
    // The same connection goes on.
    scripted(&mut conn, &Scripted::new("rc-2", vec![])).expect("processed");
    assert_eq!(effects(&mut observer, "rc-2"), 1);
}

inbox_tests::backend_tests! {
    only [postgres, sqlite]: a_constraint_refused_at_commit_is_a_counted_attempt;
}
