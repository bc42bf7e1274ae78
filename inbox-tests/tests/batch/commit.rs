//! A commit that fails (a deferred foreign key checked at commit, on
//! PostgreSQL and SQLite): nothing of the transaction commits, one message
//! carries the commit's error, every other `BatchAborted`, all retried, and
//! nothing is counted: the runtime cannot tell which body broke the
//! constraint. Without the offending message the batch is processed.

use diesel::connection::SimpleConnection;
use inbox_runtime::{AckDecision, InboxError, MaxAttempts, Recovery};
use inbox_tests::TestBackend;

use crate::support::*;

/// Rows whose parent must exist by the time the transaction commits.
const DEFERRED_DDL: &str = "CREATE TABLE batch_parents (id INTEGER NOT NULL PRIMARY KEY); \
     CREATE TABLE batch_children (parent INTEGER NOT NULL \
     REFERENCES batch_parents (id) DEFERRABLE INITIALLY DEFERRED)";

pub fn a_failed_commit_aborts_the_batch<B: TestBackend>() {
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
    if error.recovery() == Recovery::Reconnect {
        // PostgreSQL ends the transaction with the failed commit: the
        // runtime reports it lost, and the connection must be replaced.
        conn = db.connect();
    }
    assert_eq!(depth(&mut conn), 0);
    assert_eq!(all_claims(&mut observer), 0, "nothing committed");
    assert_eq!(all_effects(&mut observer), 0);
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");

    let rest: Vec<String> = batch.iter().filter(|id| **id != orphan).cloned().collect();
    let (again, _) = run_batch(&mut conn, &rest, MaxAttempts::limit(1), body);
    assert_all_processed(&again, &rest);
}

inbox_tests::backend_tests!(only [postgres, sqlite]: a_failed_commit_aborts_the_batch);
