//! Batches mixing ids claimed before with new ones. PostgreSQL and SQLite
//! tell them apart from the claim's `RETURNING`; MariaDB/MySQL's `INSERT
//! IGNORE` reports only a count, so the runtime rolls the claim back and
//! claims id by id: the outcomes must be the same everywhere.

use inbox_runtime::{InboxError, MaxAttempts, Outcome, run_idempotent};
use inbox_tests::TestBackend;

use crate::support::*;

/// Twenty ids, the even ones claimed by an earlier batch, delivered
/// shuffled: the even ones are duplicates (no body), the odd ones are
/// processed once, each with its own value.
pub fn a_mixed_batch_reports_each_message<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let all = ids("mix", 20);
    let before: Vec<String> = all.iter().step_by(2).cloned().collect();
    let (report, _) = apply_batch(&mut conn, &before);
    assert_all_processed(&report, &before);

    let mut batch = all.clone();
    Rng::new(7).shuffle(&mut batch);
    let ((report, runs), sent) = statements_of(&mut conn, |conn| apply_batch(conn, &batch));
    for (result, id) in report.results().iter().zip(&batch) {
        if before.contains(id) {
            assert!(matches!(result, Ok(Outcome::Duplicate)), "{id}: {result:?}");
            assert!(!runs.contains_key(id), "{id}: no body");
        } else {
            assert!(
                matches!(result, Ok(Outcome::Processed(value)) if value == id),
                "{id}: {result:?}"
            );
            assert_eq!(runs.get(id), Some(&1), "{id}");
        }
    }
    assert_eq!((report.processed(), report.duplicates()), (10, 10));
    let shape = shape(&sent);
    if B::NAME == "mysql" {
        // The batch claim rolled back, then one claim per id.
        let mut expected = vec!["BEGIN", "claim", "ROLLBACK", "BEGIN"];
        expected.extend(std::iter::repeat_n("claim", 20));
        expected.extend(std::iter::repeat_n("effect", 10));
        expected.push("COMMIT");
        assert_eq!(shape, expected, "{sent:#?}");
    } else {
        let mut expected = vec!["BEGIN", "claim"];
        expected.extend(std::iter::repeat_n("effect", 10));
        expected.push("COMMIT");
        assert_eq!(shape, expected, "{sent:#?}");
    }
    for id in &all {
        assert_eq!(effects(&mut observer, id), 1, "{id}");
        assert_eq!(claims(&mut observer, id), 1, "{id}");
    }
    assert_eq!(all_failure_rows(&mut observer), 0);
}

/// Ids claimed before by single deliveries (`run_idempotent`), one of them
/// dead (rejected), in a batch with new ids and copies: the claimed ones
/// and the dead one are duplicates, the new ones processed once.
pub fn ids_claimed_by_single_deliveries_are_duplicates<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for id in ["s-1", "s-3"] {
        let key = inbox_runtime::ClaimKey::new(handler(), id).unwrap();
        let result: Result<Outcome<()>, AppError> = run_idempotent(&mut conn, key, |conn| {
            apply(conn, id).map(Outcome::Processed)
        });
        assert!(matches!(result, Ok(Outcome::Processed(()))), "{result:?}");
    }
    let key = inbox_runtime::ClaimKey::new(handler(), "s-dead").unwrap();
    let result: Result<(), AppError> = run_idempotent(&mut conn, key, |_| {
        Err(AppError::Inbox(InboxError::rejected("never valid")))
    });
    assert!(result.is_err());

    let batch: Vec<String> = ["s-4", "s-3", "s-dead", "s-2", "s-1", "s-4", "s-5"]
        .map(String::from)
        .to_vec();
    let (report, runs) = run_batch(&mut conn, &batch, MaxAttempts::limit(3), |conn, id| {
        apply(conn, id)
    });
    assert_eq!(
        endings(&report),
        [
            "processed",
            "duplicate",
            "duplicate",
            "processed",
            "duplicate",
            "duplicate",
            "processed"
        ]
    );
    assert_eq!(
        runs,
        Runs::from([("s-2".into(), 1), ("s-4".into(), 1), ("s-5".into(), 1)])
    );
    assert_eq!(all_effects(&mut observer), 5);
    assert_eq!(effects(&mut observer, "s-dead"), 0);
}

/// A batch whose ids were all claimed before, on MariaDB/MySQL too, is all
/// duplicates in one claim; one new id among them makes the batch mixed.
pub fn one_new_id_among_claimed_ones_is_processed<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let claimed = ids("old", 9);
    let (report, _) = apply_batch(&mut conn, &claimed);
    assert_all_processed(&report, &claimed);
    let mut batch = claimed.clone();
    batch.insert(4, "new-one".into());
    let (report, runs) = apply_batch(&mut conn, &batch);
    let mut expected = vec!["duplicate"; 10];
    expected[4] = "processed";
    assert_eq!(endings(&report), expected);
    assert_eq!(runs, Runs::from([("new-one".into(), 1)]));
    assert_eq!(all_effects(&mut observer), 10);
}

inbox_tests::backend_tests!(
    a_mixed_batch_reports_each_message,
    ids_claimed_by_single_deliveries_are_duplicates,
    one_new_id_among_claimed_ones_is_processed,
);
