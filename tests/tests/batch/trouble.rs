//! Database trouble inside a batch (a killed connection, a lock conflict
//! in a body): nothing of the transaction commits, the message that met it
//! gets the error, every other message not committed gets
//! `InboxError::BatchAborted` with the same recovery, all of them are
//! retried, and nothing is counted against any message. Redelivered, the
//! batch processes them all.

use std::sync::{Arc, Barrier};

use diesel::connection::SimpleConnection;
use inbox_runtime::{
    AckDecision, InboxError, MaxAttempts, Outcome, Recovery, ack_decision,
    run_idempotent_batch_with,
};
use inbox_tests::{ServerBackend, TestBackend, connection_id, terminate};

use crate::support::*;

/// Asserts that `result` is `BatchAborted` caused by `cause` with
/// `recovery`, retried.
fn assert_aborted(result: &Result<Outcome<String>, AppError>, cause: &str, recovery: Recovery) {
    match result {
        Err(AppError::Inbox(InboxError::BatchAborted {
            cause_message_id,
            recovery: found,
        })) => {
            assert_eq!(cause_message_id, cause);
            assert_eq!(*found, recovery);
        }
        other => panic!("not aborted: {other:?}"),
    }
    assert_eq!(ack_decision(result), AckDecision::Retry);
}

/// The connection is killed (from another connection) inside the body of
/// the fifth message: that message gets a `Reconnect` error, the other nine
/// `BatchAborted` (Reconnect), nothing commits and nothing is counted; on
/// a new connection the redelivered batch processes all ten.
pub fn a_killed_connection_aborts_the_batch<B: ServerBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let victim = connection_id::<B>(&mut conn);
    let batch = ids("killed", 10);
    let fifth = batch[4].clone();
    let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(1), |conn, id| {
        if id == fifth {
            terminate::<B>(&mut observer, victim);
        }
        apply(conn, id)
    });
    assert_eq!(
        runs.len(),
        5,
        "the bodies after the fifth never ran: {runs:?}"
    );
    let result = &report.results()[4];
    let error = result.as_ref().expect_err("the fifth message's error");
    assert_eq!(error.recovery(), Recovery::Reconnect, "{error:?}");
    assert!(
        !matches!(error, AppError::Inbox(InboxError::BatchAborted { .. })),
        "the message that met the trouble carries its error: {error:?}"
    );
    for (index, result) in report.results().iter().enumerate() {
        if index != 4 {
            assert_aborted(result, &fifth, Recovery::Reconnect);
        }
    }
    assert!(decisions(&report).iter().all(|d| *d == AckDecision::Retry));
    assert_eq!((report.processed(), report.failed()), (0, 10));
    assert_eq!(all_claims(&mut observer), 0, "nothing committed");
    assert_eq!(all_effects(&mut observer), 0);
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");

    // The dead connection runs no body: every message is retried, on a
    // new connection.
    let (dead, runs) = apply_batch(&mut conn, &batch);
    assert!(runs.is_empty(), "{runs:?}");
    assert_eq!(dead.failed(), 10);
    for result in dead.results() {
        let error = result.as_ref().expect_err("not processed");
        assert_eq!(ack_decision(result), AckDecision::Retry);
        assert_eq!(error.recovery(), Recovery::Reconnect, "{error:?}");
    }

    let mut fresh_conn = db.connect();
    let (again, runs) = apply_batch(&mut fresh_conn, &batch);
    assert_all_processed(&again, &batch);
    assert_eq!(runs.len(), 10);
    assert_eq!(all_effects(&mut observer), 10);
}

/// The same, with ids claimed before in the batch: they keep
/// `Ok(Outcome::Duplicate)` (their ids were committed by other
/// deliveries); the others are aborted. The body's error type is Diesel's
/// own: `InboxError::find_in` finds `BatchAborted` inside it.
pub fn duplicates_stay_duplicates_when_the_batch_aborts<B: ServerBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids("dup-kill", 10);
    let before = [batch[1].clone(), batch[6].clone(), batch[8].clone()];
    let (report, _) = apply_batch(&mut conn, &before);
    assert_all_processed(&report, &before);
    let mut victim_conn = db.connect();
    let victim = connection_id::<B>(&mut victim_conn);
    let killed_at = batch[4].clone();
    let report = run_idempotent_batch_with(
        &mut victim_conn,
        &handler(),
        &batch,
        |id| id,
        MaxAttempts::limit(1),
        |conn, id: &String| -> Result<(), diesel::result::Error> {
            if *id == killed_at {
                terminate::<B>(&mut observer, victim);
            }
            exec(
                conn,
                format!(
                    "INSERT INTO batch_effects (message_id, note) VALUES ({}, 'x')",
                    literal(id)
                ),
            )?;
            Ok(())
        },
    );
    for (index, (result, id)) in report.results().iter().zip(&batch).enumerate() {
        if before.contains(id) {
            assert!(
                matches!(result, Ok(Outcome::Duplicate)),
                "{id}: a duplicate stays one: {result:?}"
            );
            continue;
        }
        let error = result.as_ref().expect_err("not committed");
        assert_eq!(ack_decision(result), AckDecision::Retry, "{id}");
        if index == 4 {
            assert_eq!(inbox_runtime::recovery(error), Recovery::Reconnect);
            continue;
        }
        match InboxError::find_in(error) {
            Some(InboxError::BatchAborted {
                cause_message_id,
                recovery,
            }) => {
                assert_eq!(cause_message_id, &killed_at);
                assert_eq!(*recovery, Recovery::Reconnect);
            }
            other => panic!("{id}: {other:?} in {error:?}"),
        }
    }
    assert_eq!(all_effects(&mut observer), 3, "only the earlier batch's");
    assert_eq!(all_failure_rows(&mut observer), 0);
}

/// SQL that makes the connection's lock waits end soon with a lock
/// conflict: PostgreSQL's `lock_timeout`, InnoDB's lock wait timeout (one
/// second, its least).
fn short_lock_wait_sql<B: TestBackend>() -> &'static str {
    if B::NAME == "mysql" {
        "SET SESSION innodb_lock_wait_timeout = 1"
    } else {
        "SET lock_timeout = '200ms'"
    }
}

/// Another transaction holds a row the body of the third message updates:
/// the lock wait ends in a lock conflict, retryable on the same
/// connection; the batch is aborted (`Retry`), nothing commits, nothing is
/// counted. Once the row is free, the same connection processes the batch.
pub fn a_lock_conflict_in_a_body_aborts_the_batch<B: ServerBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let mut holder = db.connect();
    holder
        .batch_execute("BEGIN; UPDATE batch_locks SET n = n + 1 WHERE id = 1")
        .expect("hold the row");
    conn.batch_execute(short_lock_wait_sql::<B>()).unwrap();
    let batch = ids("locked", 6);
    let third = batch[2].clone();
    let body = |conn: &mut B::Connection, id: &str| {
        apply(conn, id)?;
        if id == third {
            exec(conn, "UPDATE batch_locks SET n = n + 1 WHERE id = 1")?;
        }
        Ok(())
    };
    let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(1), body);
    assert_eq!(runs.len(), 3, "{runs:?}");
    let error = report.results()[2].as_ref().expect_err("the lock conflict");
    assert!(matches!(error, AppError::Db(_)), "{error:?}");
    assert_eq!(error.recovery(), Recovery::Retry, "{error:?}");
    assert!(inbox_runtime::is_lock_conflict(match error {
        AppError::Db(e) => e,
        _ => unreachable!(),
    }));
    for (index, result) in report.results().iter().enumerate() {
        if index != 2 {
            assert_aborted(result, &third, Recovery::Retry);
        }
    }
    assert!(decisions(&report).iter().all(|d| *d == AckDecision::Retry));
    assert_eq!(depth(&mut conn), 0);
    assert_eq!(all_claims(&mut observer), 0);
    assert_eq!(all_effects(&mut observer), 0);
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");

    holder.batch_execute("COMMIT").unwrap();
    let (again, _) = run_batch(&mut conn, &batch, MaxAttempts::limit(1), body);
    assert_all_processed(&again, &batch);
    assert_eq!(all_effects(&mut observer), 6);
}

/// Two batches deadlock in their bodies: the first message of each locks
/// one row, the second the other row, in opposite orders. The server ends
/// one transaction (the victim): that batch is aborted, every message
/// retried, nothing of it committed, nothing counted; the other batch is
/// processed. Redelivered, the victim's batch is processed.
pub fn a_deadlock_between_bodies_aborts_one_batch<B: ServerBackend>() {
    let Some((db, _conn)) = fresh::<B>() else {
        return;
    };
    let db = Arc::new(db);
    let both_locked = Arc::new(Barrier::new(2));
    let mut threads = Vec::new();
    for (side, rows) in [("left", [1, 2]), ("right", [2, 1])] {
        let (db, both_locked) = (db.clone(), both_locked.clone());
        threads.push(std::thread::spawn(move || {
            let mut conn = db.connect();
            let batch = ids(side, 2);
            let mut waited = false;
            let (report, _) = run_batch(&mut conn, &batch, MaxAttempts::limit(1), |conn, id| {
                let row = if id == batch[0] { rows[0] } else { rows[1] };
                exec(
                    conn,
                    format!("UPDATE batch_locks SET n = n + 1 WHERE id = {row}"),
                )?;
                if !waited {
                    waited = true;
                    both_locked.wait();
                }
                apply(conn, id)
            });
            (batch, report, conn)
        }));
    }
    let ends: Vec<_> = threads
        .into_iter()
        .map(|thread| thread.join().expect("a batch thread"))
        .collect();
    let mut observer = db.connect();
    let (victims, winners): (Vec<_>, Vec<_>) = ends
        .into_iter()
        .partition(|(_, report, _)| report.failed() > 0);
    assert_eq!(
        (victims.len(), winners.len()),
        (1, 1),
        "one victim: {:?}",
        victims
            .iter()
            .map(|(_, r, _)| endings(r))
            .collect::<Vec<_>>()
    );
    let (batch, report, mut conn) = victims.into_iter().next().unwrap();
    assert!(decisions(&report).iter().all(|d| *d == AckDecision::Retry));
    let error = report.results()[1].as_ref().expect_err("the deadlock");
    assert!(error.recovery().is_retryable(), "{error:?}");
    assert_aborted(&report.results()[0], &batch[1], error.recovery());
    let (winner_batch, winner, _) = &winners[0];
    assert_all_processed(winner, winner_batch);
    for id in &batch {
        assert_eq!(claims(&mut observer, id), 0, "{id}");
        assert_eq!(effects(&mut observer, id), 0, "{id}");
    }
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");
    if error.recovery() == Recovery::Reconnect {
        conn = db.connect();
    }
    let (again, _) = apply_batch(&mut conn, &batch);
    assert_all_processed(&again, &batch);
}

/// Another delivery holds an uncommitted claim of one id, the batch's claim
/// wait is unbounded (so the session's short lock waits decide): the claim
/// statement loses its lock conflict, is tried `CLAIM_ATTEMPTS` times (as
/// `run_idempotent` tries its claim), then the batch is aborted: every
/// message retried, no body run, nothing committed or counted. Once the
/// other delivery rolls back, the batch is processed. (With a bounded claim
/// wait, the held id alone is `InProgress`: `e2e/in_flight.rs`.)
pub fn a_claim_that_keeps_losing_a_lock_conflict_aborts_the_batch<B: ServerBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let mut holder = db.connect();
    holder
        .batch_execute(&format!(
            "BEGIN; INSERT INTO inbox_messages (handler, message_id) VALUES ({}, 'held-x')",
            literal(HANDLER)
        ))
        .expect("claim held-x, uncommitted");
    conn.batch_execute(short_lock_wait_sql::<B>()).unwrap();
    let batch: Vec<String> = ["held-a", "held-x", "held-b"].map(String::from).to_vec();
    let unbounded = inbox_runtime::Options::new()
        .max_attempts(MaxAttempts::limit(3))
        .claim_wait(inbox_runtime::ClaimWait::Unbounded);
    let ((report, runs), sent) =
        statements_of(&mut conn, |conn| run_batch(conn, &batch, unbounded, apply));
    assert!(runs.is_empty(), "no body ran: {runs:?}");
    let claims_sent = shape(&sent).iter().filter(|s| **s == "claim").count();
    assert_eq!(
        claims_sent,
        inbox_runtime::CLAIM_ATTEMPTS as usize,
        "{sent:#?}"
    );
    assert!(decisions(&report).iter().all(|d| *d == AckDecision::Retry));
    let carrier = report
        .results()
        .iter()
        .position(|r| !matches!(r, Err(AppError::Inbox(InboxError::BatchAborted { .. }))))
        .expect("one message carries the lock conflict");
    let error = report.results()[carrier].as_ref().expect_err("an error");
    assert_eq!(error.recovery(), Recovery::Retry, "{error:?}");
    for (at, result) in report.results().iter().enumerate() {
        if at != carrier {
            assert_aborted(result, &batch[carrier], Recovery::Retry);
        }
    }
    assert_eq!(all_effects(&mut observer), 0);
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");

    holder.batch_execute("ROLLBACK").unwrap();
    let (again, _) = apply_batch(&mut conn, &batch);
    assert_all_processed(&again, &batch);
}

inbox_tests::backend_tests!(
    only [postgres, mysql]:
    a_claim_that_keeps_losing_a_lock_conflict_aborts_the_batch,
    a_killed_connection_aborts_the_batch,
    duplicates_stay_duplicates_when_the_batch_aborts,
    a_lock_conflict_in_a_body_aborts_the_batch,
    a_deadlock_between_bodies_aborts_one_batch,
);
