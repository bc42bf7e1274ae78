//! Stored results: replayed to duplicates without running the body, bounded
//! (an oversized result rolls its delivery back), unreadable ones refused,
//! claims without a result answered as plain duplicates, and the fingerprint
//! still checked.

use std::panic::{AssertUnwindSafe, catch_unwind};

use inbox_runtime::{
    AckDecision, InboxError, MAX_STORED_RESULT_BYTES, StoredOutcome, StoredResultProblem,
    ack_decision,
};
use inbox_tests::failure_rows::failure_row;
use inbox_tests::{AppError, SqlRows, TestBackend};

use crate::handlers::*;
use crate::support::*;

fn receipt(request_id: &str, amount: u32) -> Receipt {
    Receipt {
        request_id: request_id.to_owned(),
        amount,
        note: "nnnn".to_owned(),
    }
}

pub fn a_stored_result_is_replayed_without_running_the_body<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = Charge::new("c-1", 250);
    assert_eq!(
        charge(&mut conn, &first).unwrap(),
        StoredOutcome::Processed(receipt("c-1", 250))
    );
    assert_eq!(stored_columns(&mut conn, CHARGE, "c-1"), (1, 1));
    for _ in 0..2 {
        let retry = Charge::new("c-1", 250);
        assert_eq!(
            charge(&mut conn, &retry).unwrap(),
            StoredOutcome::Replayed(receipt("c-1", 250))
        );
        assert_eq!(retry.runs(), 0);
    }
    // The same id with another amount: a conflict, not a replay.
    let changed = Charge::new("c-1", 251);
    let result = charge(&mut conn, &changed);
    assert!(
        matches!(result, Err(AppError::Inbox(InboxError::Conflict(_)))),
        "{result:?}"
    );
    assert_eq!(changed.runs(), 0);
    assert_eq!(applied(&mut conn, "c-1"), ["250"]);
}

pub fn an_oversized_result_rolls_its_delivery_back<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut big = Charge::new("c-2", 7);
    big.note_len = MAX_STORED_RESULT_BYTES;
    let result = charge(&mut conn, &big);
    let Err(AppError::Inbox(InboxError::StoredResult { problem, .. })) = &result else {
        panic!("a stored-result error expected: {result:?}");
    };
    let StoredResultProblem::TooLarge { bytes, max_bytes } = problem else {
        panic!("too large expected: {problem:?}");
    };
    assert!(*bytes > MAX_STORED_RESULT_BYTES && *max_bytes == MAX_STORED_RESULT_BYTES);
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(big.runs(), 1, "the body ran");
    assert_eq!(all_effects(&mut conn), 0, "its effect rolled back");
    assert_eq!(claims(&mut conn, CHARGE, "c-2"), 0, "and its claim");
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_failures"),
        0,
        "the inbox's own step failed, not the body: no failed attempt"
    );

    // A result just under the bound is stored whole.
    let mut largest = Charge::new("c-2", 7);
    let overhead = serde_json::to_vec(&receipt("c-2", 7)).unwrap().len() - 4;
    largest.note_len = MAX_STORED_RESULT_BYTES - overhead;
    let processed = charge(&mut conn, &largest).unwrap();
    let replayed = charge(&mut conn, &Charge::new("c-2", 7)).unwrap();
    assert!(processed.is_processed() && replayed.is_replayed());
    assert_eq!(processed.value(), replayed.value());
    assert_eq!(all_effects(&mut conn), 1);
}

pub fn a_result_that_no_longer_reads_is_refused<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    assert!(
        charge(&mut conn, &Charge::new("c-3", 9))
            .unwrap()
            .is_processed()
    );
    let later = Charge::new("c-3", 9);
    let result = charge_reshaped(&mut conn, &later);
    assert!(
        matches!(
            &result,
            Err(AppError::Inbox(InboxError::StoredResult {
                problem: StoredResultProblem::Unreadable { .. },
                ..
            }))
        ),
        "{result:?}"
    );
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(later.runs(), 0);
    assert_eq!(all_effects(&mut conn), 1);
}

pub fn a_claim_without_a_result_is_a_plain_duplicate<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    charge_unstored(&mut conn, &Charge::new("c-4", 5)).unwrap();
    assert_eq!(stored_columns(&mut conn, CHARGE, "c-4"), (1, 0));
    let later = Charge::new("c-4", 5);
    assert_eq!(charge(&mut conn, &later).unwrap(), StoredOutcome::Duplicate);
    assert_eq!(later.runs(), 0);
}

pub fn a_failed_body_stores_nothing<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let result = failing_charge(&mut conn, &Charge::new("c-5", 1));
    assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    assert_eq!(claims(&mut conn, CHARGE, "c-5"), 0);
    let retry = Charge::new("c-5", 1);
    assert!(charge(&mut conn, &retry).unwrap().is_processed());
    assert_eq!(retry.runs(), 1);
}

/// A result whose encoder panics (the user's `Serialize`) is the
/// delivery's panic, as a panicking body is: its transaction rolled back
/// (nothing left open on the connection for the next delivery to nest in),
/// the attempt counted, the panic resumed; dead at the limit (a duplicate
/// from then on).
pub fn a_panicking_result_encoder_is_a_panicking_delivery<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    for attempt in 1..=2 {
        let req = Charge::new("c-6", 6);
        let delivered = catch_unwind(AssertUnwindSafe(|| panicking_receipt(&mut conn, &req)));
        assert!(delivered.is_err(), "the encoder's panic is resumed");
        assert_eq!(req.runs(), 1);
        assert_eq!(depth(&mut conn), 0, "a transaction was left open");
        assert_eq!(all_effects(&mut conn), 0, "its effect rolled back");
        let row = failure_row::<B>(&mut conn, PANICKING_RECEIPT, "c-6").expect("counted");
        assert_eq!(row.attempts, attempt, "{row:?}");
        assert!(row.last_error.contains("encoder panicked"), "{row:?}");
        // Dead at the limit: its claim is kept (no effect) and the message
        // is a duplicate from then on.
        assert_eq!(row.dead, attempt == 2, "{row:?}");
        let claimed = i64::from(attempt == 2);
        assert_eq!(claims(&mut conn, PANICKING_RECEIPT, "c-6"), claimed);
    }
    let late = Charge::new("c-6", 6);
    let result = panicking_receipt(&mut conn, &late);
    assert_eq!(ack_decision(&result), AckDecision::Ack, "{result:?}");
    assert_eq!(late.runs(), 0, "dead: its body no longer runs");
    // The connection commits the next delivery on its own.
    assert!(
        receipt_only(&mut conn, &Charge::new("c-7", 7))
            .unwrap()
            .is_processed()
    );
    assert_eq!(depth(&mut conn), 0);
    assert_eq!(applied(&mut conn, "c-7"), ["7"]);
}

/// A body that ignored a failed statement on PostgreSQL (the transaction
/// is aborted, nothing of it can commit): the delivery fails with
/// `IgnoredStatementFailure`, retried and not counted, whether or not the
/// handler stores its result (the storing statement is the first to meet
/// the aborted transaction).
pub fn an_ignored_failure_before_the_stored_result_is_named<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let req = Charge::new("c-8", 8);
    let result = charge_ignoring_a_failure(&mut conn, &req);
    assert!(
        matches!(
            result,
            Err(AppError::Inbox(InboxError::IgnoredStatementFailure { .. }))
        ),
        "{result:?}"
    );
    assert_eq!(ack_decision(&result), AckDecision::Retry);
    assert_eq!(claims(&mut conn, "payloads.receipt", "c-8"), 0);
    assert_eq!(all_effects(&mut conn), 0);
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_failures"),
        0,
        "not counted"
    );
}

use inbox_tests::transaction_depth as depth;

inbox_tests::backend_tests! {
    a_panicking_result_encoder_is_a_panicking_delivery,
    a_stored_result_is_replayed_without_running_the_body,
    an_oversized_result_rolls_its_delivery_back,
    a_result_that_no_longer_reads_is_refused,
    a_claim_without_a_result_is_a_plain_duplicate,
    a_failed_body_stores_nothing;
    only [postgres]: an_ignored_failure_before_the_stored_result_is_named;
}
