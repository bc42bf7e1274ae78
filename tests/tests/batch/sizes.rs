//! Batch sizes: longer than `MAX_BATCH_MESSAGES` (several transactions, in
//! order) and than a claim statement's bound of ids (several statements),
//! and the statements a batch sends: one claim for the whole batch.

use inbox_runtime::MAX_BATCH_MESSAGES;
use inbox_tests::{SqlRows, TestBackend};

use crate::support::*;

/// The most ids one claim statement of `B` takes (`MAX_CLAIMS_PER_STATEMENT`).
fn claims_per_statement<B: TestBackend>() -> usize {
    if B::NAME == "sqlite" { 499 } else { 1000 }
}

/// How many claim statements a batch of `n` new ids sends: one per
/// statement bound, per transaction of at most `MAX_BATCH_MESSAGES`.
fn claim_statements<B: TestBackend>(n: usize) -> usize {
    let per = claims_per_statement::<B>();
    (0..n)
        .step_by(MAX_BATCH_MESSAGES)
        .map(|start| (n - start).min(MAX_BATCH_MESSAGES).div_ceil(per))
        .sum()
}

fn count(shape: &[&str], what: &str) -> usize {
    shape.iter().filter(|s| **s == what).count()
}

/// 2,500 new ids: three transactions (1,000, 1,000, 500), each claiming in
/// as many statements as the backend's bound needs; every message processed
/// once, in order, without a database error; then all duplicates.
pub fn a_batch_longer_than_max_batch_messages_is_processed_once<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids("big", 2500);
    let ((report, runs), sent) = statements_of(&mut conn, |conn| apply_batch(conn, &batch));
    assert_all_processed(&report, &batch);
    assert_eq!(report.processed(), 2500);
    assert!(runs.values().all(|n| *n == 1) && runs.len() == 2500);
    let sent_shape = shape(&sent);
    let first = &sent_shape;
    assert_eq!(count(first, "BEGIN"), 3, "three transactions");
    assert_eq!(count(first, "COMMIT"), 3);
    assert_eq!(count(first, "ROLLBACK"), 0);
    assert_eq!(count(first, "effect"), 2500);
    assert_eq!(count(first, "claim"), claim_statements::<B>(2500));
    assert_eq!(first.len(), 3 + 3 + 2500 + claim_statements::<B>(2500));
    assert_eq!(all_claims(&mut observer), 2500);
    assert_eq!(all_effects(&mut observer), 2500);
    assert_eq!(
        observer.bigint("SELECT COUNT(DISTINCT message_id) AS value FROM batch_effects"),
        2500
    );

    let ((again, runs), sent) = statements_of(&mut conn, |conn| apply_batch(conn, &batch));
    assert_all_duplicates(&again);
    assert!(runs.is_empty());
    let again_shape = shape(&sent);
    assert_eq!(count(&again_shape, "BEGIN"), 3);
    assert_eq!(count(&again_shape, "effect"), 0);
    assert_eq!(all_effects(&mut observer), 2500);
}

/// A batch just over one claim statement's bound (SQLite's is 499 ids),
/// with half of it claimed before: every message once, no database error;
/// redelivered, one claim statement per bound.
pub fn a_batch_longer_than_a_claim_statement_is_processed_once<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let n = claims_per_statement::<B>() + 1;
    let batch = ids("bound", n);
    let halves: Vec<String> = batch.iter().step_by(2).cloned().collect();
    let (report, _) = apply_batch(&mut conn, &halves);
    assert_all_processed(&report, &halves);
    let (report, runs) = apply_batch(&mut conn, &batch);
    for (position, ending) in endings(&report).iter().enumerate() {
        let expected = if position % 2 == 0 {
            "duplicate"
        } else {
            "processed"
        };
        assert_eq!(ending, expected, "position {position}");
    }
    assert_eq!(runs.len(), n / 2);
    assert!(runs.values().all(|n| *n == 1));
    let ((again, runs), sent) = statements_of(&mut conn, |conn| apply_batch(conn, &batch));
    assert_all_duplicates(&again);
    assert!(runs.is_empty());
    // SQLite: 500 ids, two statements in one transaction; elsewhere the
    // bound is `MAX_BATCH_MESSAGES`: one transaction of 1,000 and one of 1.
    let expected: &[&str] = if B::NAME == "sqlite" {
        &["BEGIN", "claim", "claim", "COMMIT"]
    } else {
        &["BEGIN", "claim", "COMMIT", "BEGIN", "claim", "COMMIT"]
    };
    assert_eq!(shape(&sent), expected, "{}", sent.len());
    assert_eq!(all_claims(&mut observer), n as i64);
    assert_eq!(all_effects(&mut observer), n as i64);
}

/// A batch of 100 new ids sends `BEGIN`, one claim statement, the 100
/// effects, `COMMIT`; redelivered, `BEGIN`, one claim, `COMMIT`. Nothing
/// touches `inbox_failures`.
pub fn a_batch_sends_one_claim_statement<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let batch = ids("one-claim", 100);
    let ((report, _), processed) = statements_of(&mut conn, |conn| apply_batch(conn, &batch));
    assert_all_processed(&report, &batch);
    let mut expected = vec!["BEGIN", "claim"];
    expected.extend(std::iter::repeat_n("effect", 100));
    expected.push("COMMIT");
    assert_eq!(shape(&processed), expected, "{processed:#?}");

    let ((again, _), duplicate) = statements_of(&mut conn, |conn| apply_batch(conn, &batch));
    assert_all_duplicates(&again);
    assert_eq!(
        shape(&duplicate),
        ["BEGIN", "claim", "COMMIT"],
        "{duplicate:#?}"
    );
    assert!(
        processed
            .iter()
            .chain(&duplicate)
            .all(|sql| !sql.contains("inbox_failures"))
    );
}

inbox_tests::backend_tests!(
    a_batch_longer_than_max_batch_messages_is_processed_once,
    a_batch_longer_than_a_claim_statement_is_processed_once,
    a_batch_sends_one_claim_statement,
);
