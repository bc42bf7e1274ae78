//! A commit that fails on a connection that stays sound. Refused because a
//! body ignored a failed statement (PostgreSQL), the batch is halved until
//! that message runs alone: the others commit, and it gets the single
//! form's error (retried, not counted: the statement's failure may have
//! been a lock conflict). Refused by a constraint checked at commit (a
//! deferred foreign key, PostgreSQL and SQLite), the same split, and the
//! message that violates it gets the single form's answer to that: a failed
//! attempt, counted (dead here, at a limit of 1).

use inbox_runtime::{AckDecision, InboxError, MaxAttempts, Recovery};
use inbox_tests::{
    COUNT_CHILDREN_SQL, ORPHAN_SQL, SqlRows, TestBackend, create_deferred_foreign_key,
};

use crate::support::*;

/// PostgreSQL: a body that ignored a failed statement (its transaction
/// cannot commit).
pub fn a_refused_commit_spares_the_other_messages<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids("refused", 6);
    let culprit = batch[3].clone();
    let body = |conn: &mut B::Connection, id: &str| {
        apply(conn, id)?;
        if id == culprit {
            let _ignored = exec(conn, "SELECT 1 / 0");
        }
        Ok(())
    };
    let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(1), body);
    for (at, result) in report.results().iter().enumerate() {
        if at == 3 {
            let error = result.as_ref().expect_err("the culprit's error");
            assert_eq!(error.recovery(), Recovery::Retry, "{error:?}");
            assert!(
                matches!(
                    error,
                    AppError::Inbox(InboxError::IgnoredStatementFailure { .. })
                ),
                "{error:?}"
            );
        } else {
            assert!(
                matches!(result, Ok(inbox_runtime::Outcome::Processed(_))),
                "{at}: {result:?}"
            );
        }
    }
    assert!(runs[&culprit] >= 2, "the culprit ran again alone: {runs:?}");
    assert_eq!(depth(&mut conn), 0);
    assert_eq!(all_claims(&mut observer), 5, "the others committed");
    assert_eq!(effects(&mut observer, &culprit), 0);
    assert_eq!(all_effects(&mut observer), 5);
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");
}

/// A deferred foreign key that one message's effect violates, refused at
/// `COMMIT` (PostgreSQL ends the transaction with it; SQLite keeps it open
/// and the runtime rolls it back): the others commit, the culprit's attempt
/// is counted, and the same connection goes on.
pub fn a_constraint_refused_at_commit_spares_the_others_and_counts_the_culprit<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    create_deferred_foreign_key::<B>(&mut conn);
    let mut observer = db.connect();
    let batch = ids("orphan", 6);
    let orphan = batch[3].clone();
    let body = |conn: &mut B::Connection, id: &str| {
        apply(conn, id)?;
        if id == orphan {
            exec(conn, ORPHAN_SQL)?;
        }
        Ok(())
    };
    let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(1), body);
    for (at, result) in report.results().iter().enumerate() {
        if at == 3 {
            let error = result.as_ref().expect_err("the orphan's error");
            assert!(
                matches!(
                    error,
                    AppError::Inbox(InboxError::AttemptsExhausted { attempts: 1, .. })
                ),
                "{error:?}"
            );
            assert_eq!(error.recovery(), Recovery::Never, "{error:?}");
        } else {
            assert!(
                matches!(result, Ok(inbox_runtime::Outcome::Processed(_))),
                "{at}: {result:?}"
            );
        }
    }
    assert_eq!(
        decisions(&report)[3],
        AckDecision::DeadLetter,
        "{:?}",
        endings(&report)
    );
    assert!(runs[&orphan] >= 2, "the orphan ran again alone: {runs:?}");
    assert_eq!(depth(&mut conn), 0);
    assert_eq!(all_claims(&mut observer), 6, "the others and the dead one");
    assert_eq!(effects(&mut observer, &orphan), 0);
    assert_eq!(all_effects(&mut observer), 5);
    assert_eq!(all_failure_rows(&mut observer), 1, "the orphan, counted");
    assert_eq!(observer.bigint(COUNT_CHILDREN_SQL), 0);

    // The same connection goes on.
    let next = ids("after", 3);
    let (again, _) = run_batch(&mut conn, &next, MaxAttempts::limit(1), |conn, id| {
        apply(conn, id)
    });
    assert_all_processed(&again, &next);
}

inbox_tests::backend_tests! {
    only [postgres]: a_refused_commit_spares_the_other_messages;
    only [postgres, sqlite]: a_constraint_refused_at_commit_spares_the_others_and_counts_the_culprit;
}
