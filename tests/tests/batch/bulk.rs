//! `run_idempotent_batch_bulk`: one body for all the new messages of a
//! transaction. It gets only the ids just claimed, runs once per
//! transaction (one statement can write every effect), and when it fails
//! the batch is halved until the failing message runs alone under the
//! single form's rules while the others commit.

use std::cell::RefCell;

use diesel::Connection;
use inbox_runtime::{
    AckDecision, InboxError, MaxAttempts, Outcome, ack_decision, run_idempotent_batch_bulk_with,
};
use inbox_tests::TestBackend;

use crate::support::*;

/// One multi-row `INSERT` of the effects of `ids`.
fn apply_all<C: Connection>(conn: &mut C, ids: &[&String]) -> Result<(), AppError> {
    let rows: Vec<String> = ids
        .iter()
        .map(|id| format!("({}, 'applied')", literal(id)))
        .collect();
    exec(
        conn,
        format!(
            "INSERT INTO batch_effects (message_id, note) VALUES {}",
            rows.join(", ")
        ),
    )?;
    Ok(())
}

pub fn a_bulk_body_gets_the_new_messages_in_one_call<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = ids("bulk", 4);
    let calls = RefCell::new(Vec::<Vec<String>>::new());
    let mut body = |conn: &mut B::Connection, ids: &[&String]| {
        calls
            .borrow_mut()
            .push(ids.iter().map(|id| (*id).clone()).collect());
        apply_all(conn, ids)
    };
    let ((report, _), sent) = statements_of(&mut conn, |conn| {
        let report = run_idempotent_batch_bulk_with(
            conn,
            &handler(),
            &first,
            |id| id,
            MaxAttempts::limit(3),
            &mut body,
        );
        (report, ())
    });
    assert_eq!(report.processed(), 4, "{:?}", report.results());
    assert_eq!(
        shape(&sent),
        ["BEGIN", "claim", "effect", "COMMIT"],
        "one statement for every effect: {sent:#?}"
    );
    // Two already claimed, a copy and an invalid id: the body gets the two new ones.
    let mut second: Vec<String> = vec![first[0].clone(), "bulk-new-1".into(), first[1].clone()];
    second.extend(["bulk-new-2".into(), "bulk-new-1".into(), String::new()]);
    let report = run_idempotent_batch_bulk_with(
        &mut conn,
        &handler(),
        &second,
        |id| id,
        MaxAttempts::limit(3),
        &mut body,
    );
    assert_eq!(
        calls.borrow().last().unwrap(),
        &["bulk-new-1".to_owned(), "bulk-new-2".to_owned()]
    );
    assert_eq!(
        endings(&report)[..5],
        [
            "duplicate",
            "processed",
            "duplicate",
            "processed",
            "duplicate"
        ]
    );
    assert_eq!(ack_decision(&report.results()[5]), AckDecision::DeadLetter);
    assert_eq!(all_effects(&mut conn), 6);
    // All claimed before: the body is not called.
    let before = calls.borrow().len();
    let again = run_idempotent_batch_bulk_with(
        &mut conn,
        &handler(),
        &first,
        |id| id,
        MaxAttempts::limit(3),
        &mut body,
    );
    assert_eq!(again.duplicates(), 4);
    assert_eq!(calls.borrow().len(), before, "no call for duplicates only");
}

pub fn a_failing_bulk_body_is_halved_down_to_the_culprit<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let batch = ids("halve", 8);
    let (failing, rejected_id) = (batch[5].clone(), batch[2].clone());
    let calls = RefCell::new(0);
    let body = |conn: &mut B::Connection, ids: &[&String]| {
        *calls.borrow_mut() += 1;
        apply_all(conn, ids)?;
        if ids.contains(&&rejected_id) {
            return Err(InboxError::rejected("bad sku").into());
        }
        if ids.contains(&&failing) {
            return Err(AppError::Failed("boom"));
        }
        Ok(())
    };
    let report = run_idempotent_batch_bulk_with(
        &mut conn,
        &handler(),
        &batch,
        |id| id,
        MaxAttempts::limit(2),
        body,
    );
    for (at, result) in report.results().iter().enumerate() {
        match at {
            2 => assert_eq!(ack_decision(result), AckDecision::DeadLetter, "{result:?}"),
            5 => assert!(
                matches!(result, Err(AppError::Failed("boom"))),
                "{result:?}"
            ),
            _ => assert!(
                matches!(result, Ok(Outcome::Processed(()))),
                "{at}: {result:?}"
            ),
        }
    }
    assert!(
        *calls.borrow() <= 12,
        "halving, not one call per message: {}",
        calls.borrow()
    );
    assert_eq!(
        failure_row::<B>(&mut conn, &failing),
        counted(1, "the handler failed: boom")
    );
    assert_eq!(
        failure_row::<B>(&mut conn, &rejected_id),
        rejected(1, "bad sku")
    );
    for (at, id) in batch.iter().enumerate() {
        let expected = i64::from(at != 2 && at != 5);
        assert_eq!(effects(&mut conn, id), expected, "{id}");
    }
    assert_eq!(depth(&mut conn), 0);
}

pub fn a_panicking_bulk_body_is_counted_and_resumed<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let batch = ids("bulk-panic", 4);
    let culprit = batch[3].clone();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_idempotent_batch_bulk_with(
            &mut conn,
            &handler(),
            &batch,
            |id| id,
            MaxAttempts::limit(3),
            |conn, ids: &[&String]| {
                if ids.contains(&&culprit) {
                    panic!("deliberate panic in a bulk body");
                }
                apply_all(conn, ids)
            },
        )
    }));
    assert!(caught.is_err(), "the panic is resumed");
    assert_eq!(depth(&mut conn), 0);
    for id in &batch[..3] {
        assert_eq!(
            effects(&mut conn, id),
            1,
            "{id}: committed before the culprit ran alone"
        );
    }
    let row = failure_row::<B>(&mut conn, &culprit).expect("the panic was counted");
    assert_eq!(row.attempts, 1);
}

inbox_tests::backend_tests! {
    a_bulk_body_gets_the_new_messages_in_one_call,
    a_failing_bulk_body_is_halved_down_to_the_culprit,
    a_panicking_bulk_body_is_counted_and_resumed;
}
