//! A body that fails on one message does not sink the others: the messages
//! before it commit in a transaction of their own, the failed one runs
//! again alone (and only then is its attempt counted), and the batch goes
//! on with the messages after it. Up to dead (`max_attempts`) and rejected.

use inbox_runtime::{AckDecision, InboxError, MaxAttempts, Outcome, ack_decision, dead_letters};
use inbox_tests::TestBackend;

use crate::support::*;

const BOOM: &str = "the handler failed: boom";

/// A batch of ten new ids whose body fails on the one at `position`: the
/// other nine are processed, the failed one gets its error and one counted
/// attempt; the messages before it ran twice (rolled back once), the
/// failed one twice (in the batch, then alone), the ones after it once.
fn one_failure_at<B: TestBackend>(position: usize) {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids(&format!("fail-at-{position}"), 10);
    let failing = batch[position].clone();
    let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(5), |conn, id| {
        apply(conn, id)?;
        if id == failing {
            return Err(AppError::Failed("boom"));
        }
        Ok(())
    });
    for (index, (result, id)) in report.results().iter().zip(&batch).enumerate() {
        if index == position {
            assert!(
                matches!(result, Err(AppError::Failed("boom"))),
                "{id}: {result:?}"
            );
            assert_eq!(ack_decision(result), AckDecision::Retry);
            assert_eq!(effects(&mut observer, id), 0, "{id}: rolled back");
            assert_eq!(claims(&mut observer, id), 0, "{id}: not claimed");
            assert_eq!(
                failure_row::<B>(&mut observer, id),
                counted(1, BOOM),
                "{id}: one attempt"
            );
        } else {
            assert!(
                matches!(result, Ok(Outcome::Processed(value)) if value == id),
                "{id}: {result:?}"
            );
            assert_eq!(effects(&mut observer, id), 1, "{id}: committed once");
            assert_eq!(claims(&mut observer, id), 1, "{id}");
            assert_eq!(failure_row::<B>(&mut observer, id), None, "{id}");
        }
        let expected_runs = if index <= position { 2 } else { 1 };
        assert_eq!(runs.get(id), Some(&expected_runs), "{id} ran");
    }
    assert_eq!((report.processed(), report.failed()), (9, 1));
    assert_eq!(all_failure_rows(&mut observer), 1);
    assert_eq!(depth(&mut conn), 0);

    // Redelivered, the batch processes the failed message only.
    let (again, runs) = apply_batch(&mut conn, &batch);
    let mut expected = vec!["duplicate"; 10];
    expected[position] = "processed";
    assert_eq!(endings(&again), expected);
    assert_eq!(runs, Runs::from([(failing.clone(), 1)]));
    assert_eq!(effects(&mut observer, &failing), 1);
}

pub fn a_failure_first_spares_the_others<B: TestBackend>() {
    one_failure_at::<B>(0);
}

pub fn a_failure_in_the_middle_spares_the_others<B: TestBackend>() {
    one_failure_at::<B>(4);
}

pub fn a_failure_last_spares_the_others<B: TestBackend>() {
    one_failure_at::<B>(9);
}

/// Message `X` fails only when message `Y` ran earlier in the same
/// transaction: in the batch it fails, yet alone it succeeds. It is
/// processed, and no attempt is recorded against it: a message is never
/// charged for a failure that needed another message.
pub fn a_failure_only_in_combination_is_not_counted<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids("combo", 10);
    let (y, x) = (batch[2].clone(), batch[6].clone());
    let clock = TransactionClock::install(&mut conn);
    let mut y_ran_in: Option<u64> = None;
    let mut x_failed = 0;
    let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(1), |conn, id| {
        apply(conn, id)?;
        if id == y {
            y_ran_in = Some(clock.now());
        }
        if id == x && y_ran_in == Some(clock.now()) {
            x_failed += 1;
            return Err(AppError::Failed("only after Y"));
        }
        Ok(())
    });
    assert_eq!(x_failed, 1, "X failed in the batch's transaction");
    assert_eq!(runs.get(&x), Some(&2), "X ran again, alone");
    assert_all_processed(&report, &batch);
    assert_eq!(
        failure_row::<B>(&mut observer, &x),
        None,
        "X is not charged (with a limit of 1 it would be dead)"
    );
    assert_eq!(all_failure_rows(&mut observer), 0);
    for id in &batch {
        assert_eq!(effects(&mut observer, id), 1, "{id}");
    }
}

/// A message that always fails, redelivered with the batch: one attempt
/// per delivery (not one per run), dead at `max_attempts` with
/// `AttemptsExhausted`, and a duplicate in later batches; the others of
/// each batch are processed.
pub fn max_attempts_across_redeliveries_makes_it_dead<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let always = |conn: &mut B::Connection, id: &str| {
        apply(conn, id)?;
        if id == "bad" {
            return Err(AppError::Failed("boom"));
        }
        Ok(())
    };
    for delivery in 1..=3 {
        let mut batch = ids(&format!("round-{delivery}"), 6);
        batch.insert(3, "bad".into());
        let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(3), always);
        assert_eq!(runs.get("bad"), Some(&2), "in the batch, then alone");
        assert_eq!(report.processed(), 6, "delivery {delivery}");
        let result = &report.results()[3];
        if delivery < 3 {
            assert!(
                matches!(result, Err(AppError::Failed("boom"))),
                "{result:?}"
            );
            assert_eq!(ack_decision(result), AckDecision::Retry);
            assert_eq!(
                failure_row::<B>(&mut observer, "bad"),
                counted(delivery, BOOM)
            );
            assert_eq!(claims(&mut observer, "bad"), 0);
        } else {
            assert!(
                matches!(
                    result,
                    Err(AppError::Inbox(InboxError::AttemptsExhausted { attempts: 3, last_error }))
                        if last_error == BOOM
                ),
                "{result:?}"
            );
            assert_eq!(ack_decision(result), AckDecision::DeadLetter);
            assert_eq!(failure_row::<B>(&mut observer, "bad"), exhausted(3, BOOM));
            assert_eq!(claims(&mut observer, "bad"), 1, "claimed as dead");
        }
    }
    let page = dead_letters::list(&mut observer, &handler(), None, 10).unwrap();
    assert_eq!(page.letters.len(), 1);
    assert_eq!(
        (
            page.letters[0].message_id.as_str(),
            page.letters[0].attempts
        ),
        ("bad", 3)
    );
    let batch: Vec<String> = ["later-1", "bad", "later-2"].map(String::from).to_vec();
    let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(3), always);
    assert_eq!(endings(&report), ["processed", "duplicate", "processed"]);
    assert!(
        !runs.contains_key("bad"),
        "a dead message's body never runs"
    );
    assert_eq!(effects(&mut observer, "bad"), 0);
}

/// A rejection in a batch: that message is dead at once (one attempt,
/// rejected), dead-lettered; the others are processed; later it is a
/// duplicate.
pub fn a_rejection_in_a_batch_is_dead_at_once<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids("reject", 8);
    let bad = batch[5].clone();
    let body = |conn: &mut B::Connection, id: &str| {
        apply(conn, id)?;
        if id == bad {
            return Err(AppError::Inbox(InboxError::rejected("unknown sku")));
        }
        Ok(())
    };
    let (report, _) = run_batch(&mut conn, &batch, MaxAttempts::limit(5), body);
    let result = &report.results()[5];
    assert!(
        matches!(result, Err(AppError::Inbox(InboxError::Rejected { reason })) if reason == "unknown sku"),
        "{result:?}"
    );
    let mut expected = vec![AckDecision::Ack; 8];
    expected[5] = AckDecision::DeadLetter;
    assert_eq!(decisions(&report), expected);
    assert_eq!(report.processed(), 7);
    assert_eq!(
        failure_row::<B>(&mut observer, &bad),
        rejected(1, "unknown sku")
    );
    assert_eq!(claims(&mut observer, &bad), 1, "claimed as dead");
    assert_eq!(effects(&mut observer, &bad), 0);
    assert_eq!(all_effects(&mut observer), 7);
    let (again, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(5), body);
    assert_all_duplicates(&again);
    assert!(runs.is_empty());
}

/// Several messages fail in one batch, each alone after the split: every
/// one gets its error and exactly one attempt; the others are processed.
pub fn several_failures_in_one_batch_are_each_counted_once<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids("several", 10);
    let failing = [
        batch[1].clone(),
        batch[4].clone(),
        batch[5].clone(),
        batch[9].clone(),
    ];
    let (report, _) = run_batch(&mut conn, &batch, MaxAttempts::limit(5), |conn, id| {
        apply(conn, id)?;
        if failing.iter().any(|f| f == id) {
            return Err(AppError::Failed("boom"));
        }
        Ok(())
    });
    for (result, id) in report.results().iter().zip(&batch) {
        if failing.contains(id) {
            assert!(
                matches!(result, Err(AppError::Failed("boom"))),
                "{id}: {result:?}"
            );
            assert_eq!(
                failure_row::<B>(&mut observer, id),
                counted(1, BOOM),
                "{id}"
            );
            assert_eq!(effects(&mut observer, id), 0, "{id}");
        } else {
            assert!(
                matches!(result, Ok(Outcome::Processed(_))),
                "{id}: {result:?}"
            );
            assert_eq!(effects(&mut observer, id), 1, "{id}");
        }
    }
    assert_eq!((report.processed(), report.failed()), (6, 4));
    assert_eq!(all_failure_rows(&mut observer), 4);
    assert_eq!(all_claims(&mut observer), 6);
}

inbox_tests::backend_tests!(
    a_failure_first_spares_the_others,
    a_failure_in_the_middle_spares_the_others,
    a_failure_last_spares_the_others,
    a_failure_only_in_combination_is_not_counted,
    max_attempts_across_redeliveries_makes_it_dead,
    a_rejection_in_a_batch_is_dead_at_once,
    several_failures_in_one_batch_are_each_counted_once,
);
