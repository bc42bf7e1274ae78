//! A commit that fails. Refused on a connection that stays sound (a deferred
//! foreign key on SQLite; on PostgreSQL a body that ignored a failed
//! statement), the batch is halved until the message that broke it runs
//! alone: the others commit, and it gets the single form's error (retried,
//! not counted). A failed commit that loses the connection (a deferred
//! foreign key on PostgreSQL ends the transaction with the `COMMIT`) aborts
//! the batch: nothing of it commits, one message carries the error, every
//! other `BatchAborted`, all to be retried on a new connection.

use diesel::connection::SimpleConnection;
use inbox_runtime::{AckDecision, InboxError, MaxAttempts, Recovery};
use inbox_tests::TestBackend;

use crate::support::*;

/// Rows whose parent must exist by the time the transaction commits.
const DEFERRED_DDL: &str = "CREATE TABLE batch_parents (id INTEGER NOT NULL PRIMARY KEY); \
     CREATE TABLE batch_children (parent INTEGER NOT NULL \
     REFERENCES batch_parents (id) DEFERRABLE INITIALLY DEFERRED)";

/// SQLite: a deferred foreign key refused at commit; PostgreSQL: a body
/// that ignored a failed statement (its transaction cannot commit).
pub fn a_refused_commit_spares_the_other_messages<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    conn.batch_execute(DEFERRED_DDL).unwrap();
    if B::NAME == "sqlite" {
        conn.batch_execute("PRAGMA foreign_keys = ON").unwrap();
    }
    let mut observer = db.connect();
    let batch = ids("refused", 6);
    let culprit = batch[3].clone();
    let body = |conn: &mut B::Connection, id: &str| {
        apply(conn, id)?;
        if id == culprit {
            if B::NAME == "postgres" {
                let _ignored = exec(conn, "SELECT 1 / 0");
            } else {
                exec(conn, "INSERT INTO batch_children (parent) VALUES (7)")?;
            }
        }
        Ok(())
    };
    let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(1), body);
    for (at, result) in report.results().iter().enumerate() {
        if at == 3 {
            let error = result.as_ref().expect_err("the culprit's error");
            assert_eq!(error.recovery(), Recovery::Retry, "{error:?}");
            if B::NAME == "postgres" {
                assert!(
                    matches!(
                        error,
                        AppError::Inbox(InboxError::IgnoredStatementFailure { .. })
                    ),
                    "{error:?}"
                );
            }
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

/// PostgreSQL: a deferred foreign key fails the `COMMIT`, which ends the
/// transaction; the runtime reports it lost and the connection must be
/// replaced, so the batch cannot be split on it.
pub fn a_failed_commit_that_loses_the_connection_aborts_the_batch<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    conn.batch_execute(DEFERRED_DDL).unwrap();
    if B::NAME == "sqlite" {
        conn.batch_execute("PRAGMA foreign_keys = ON").unwrap();
    }
    let mut observer = db.connect();
    let batch = ids("commit", 6);
    let orphan = batch[3].clone();
    let body = |conn: &mut B::Connection, id: &str| {
        apply(conn, id)?;
        if id == orphan {
            exec(conn, "INSERT INTO batch_children (parent) VALUES (7)")?;
        }
        Ok(())
    };
    let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(1), body);
    assert_eq!(runs.len(), 6, "every body ran before the commit");
    let carriers: Vec<usize> = (0..6)
        .filter(|at| {
            !matches!(
                report.results()[*at],
                Err(AppError::Inbox(InboxError::BatchAborted { .. }))
            )
        })
        .collect();
    assert_eq!(carriers.len(), 1, "{:?}", endings(&report));
    let carrier = carriers[0];
    let error = report.results()[carrier]
        .as_ref()
        .expect_err("the commit's error");
    for (at, result) in report.results().iter().enumerate() {
        if let Err(AppError::Inbox(InboxError::BatchAborted {
            cause_message_id,
            recovery,
        })) = result
        {
            assert_eq!(cause_message_id, &batch[carrier], "position {at}");
            assert_eq!(*recovery, error.recovery(), "position {at}: {error:?}");
        }
    }
    assert!(decisions(&report).iter().all(|d| *d == AckDecision::Retry));
    assert_eq!(error.recovery(), Recovery::Reconnect, "{error:?}");
    conn = db.connect();
    assert_eq!(depth(&mut conn), 0);
    assert_eq!(all_claims(&mut observer), 0, "nothing committed");
    assert_eq!(all_effects(&mut observer), 0);
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");

    let rest: Vec<String> = batch.iter().filter(|id| **id != orphan).cloned().collect();
    let (again, _) = run_batch(&mut conn, &rest, MaxAttempts::limit(1), body);
    assert_all_processed(&again, &rest);
}

inbox_tests::backend_tests! {
    only [postgres, sqlite]: a_refused_commit_spares_the_other_messages;
    only [postgres]: a_failed_commit_that_loses_the_connection_aborts_the_batch;
}
