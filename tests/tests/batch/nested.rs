//! A batch inside a transaction its caller opened runs as a savepoint:
//! its claims and effects go with the caller's transaction, and failures
//! inside it are not counted (as for a nested `run_idempotent`).

use diesel::Connection;
use inbox_runtime::{MaxAttempts, Outcome};
use inbox_tests::TestBackend;

use crate::support::*;

/// The caller rolls back: nothing is claimed, nothing applied; the batch
/// is processed again later.
pub fn a_rolled_back_caller_keeps_no_claims<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids("nested-rb", 5);
    let outcome: Result<(), diesel::result::Error> = conn.transaction(|conn| {
        let (report, _) = apply_batch(conn, &batch);
        assert_all_processed(&report, &batch);
        assert_eq!(depth(conn), 1, "back at the caller's level");
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(outcome.is_err());
    assert_eq!(all_claims(&mut observer), 0, "nothing claimed");
    assert_eq!(all_effects(&mut observer), 0);
    let (report, _) = apply_batch(&mut conn, &batch);
    assert_all_processed(&report, &batch);
}

/// The caller commits: the claims are there, and a redelivery is all
/// duplicates.
pub fn a_committed_caller_keeps_the_claims<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids("nested-ok", 5);
    conn.transaction(|conn| {
        let (report, _) = apply_batch(conn, &batch);
        assert_all_processed(&report, &batch);
        diesel::QueryResult::Ok(())
    })
    .unwrap();
    assert_eq!(all_claims(&mut observer), 5);
    assert_eq!(all_effects(&mut observer), 5);
    let (again, runs) = apply_batch(&mut conn, &batch);
    assert_all_duplicates(&again);
    assert!(runs.is_empty());
}

/// A failing body inside a nested batch: the message gets its error, the
/// others are processed, and nothing is counted; after the caller commits,
/// the failed one alone is processed by a redelivery.
pub fn failures_inside_a_nested_batch_are_not_counted<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let batch = ids("nested-fail", 6);
    let bad = batch[3].clone();
    conn.transaction(|conn| {
        for _ in 0..3 {
            let (report, _) = run_batch(conn, &batch, MaxAttempts::limit(1), |conn, id| {
                apply(conn, id)?;
                if id == bad {
                    return Err(AppError::Failed("boom"));
                }
                Ok(())
            });
            assert!(
                matches!(&report.results()[3], Err(AppError::Failed("boom"))),
                "never dead, though the limit is one: {:?}",
                report.results()[3]
            );
            assert_eq!(report.failed(), 1);
        }
        assert_eq!(depth(conn), 1);
        diesel::QueryResult::Ok(())
    })
    .unwrap();
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");
    assert_eq!(all_claims(&mut observer), 5);
    assert_eq!(effects(&mut observer, &bad), 0);
    let (again, runs) = apply_batch(&mut conn, &batch);
    let mut expected = vec!["duplicate"; 6];
    expected[3] = "processed";
    assert_eq!(endings(&again), expected);
    assert_eq!(runs.len(), 1);
    assert!(matches!(&again.results()[3], Ok(Outcome::Processed(v)) if *v == bad));
}

inbox_tests::backend_tests!(
    a_rolled_back_caller_keeps_no_claims,
    a_committed_caller_keeps_the_claims,
    failures_inside_a_nested_batch_are_not_counted,
);
