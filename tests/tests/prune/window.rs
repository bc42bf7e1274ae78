//! Rows inside the retention window are never deleted, rows outside are,
//! on every backend; batches, scopes, progress and limits.

use std::ops::ControlFlow;

use diesel::Connection;
use inbox_runtime::prune::{PruneScope, PrunedTable};
use inbox_runtime::{InboxError, MAX_RETENTION, Outcome, Prune, RetentionPolicy};

use crate::support::*;

inbox_tests::backend_tests!(
    inside_stays_outside_goes,
    handler_windows_and_scopes,
    progress_and_limits,
    refuses_to_run_inside_a_transaction,
    extreme_and_fractional_windows,
);

pub fn inside_stays_outside_goes<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let old_a = ids("old-a", 230);
    let old_b = ids("old-b", 120);
    let just_outside = ids("edge-out", 5);
    let just_inside = ids("edge-in", 5);
    seed::<B>(&mut conn, "a", &old_a, Some(10 * DAY));
    seed::<B>(&mut conn, "b", &old_b, Some(8 * DAY));
    seed::<B>(&mut conn, "a", &just_outside, Some(7 * DAY + 120));
    seed::<B>(&mut conn, "a", &just_inside, Some(7 * DAY - HOUR));
    // Fresh ids claimed through the inbox itself.
    let fresh = ids("fresh", 20);
    for id in &fresh {
        assert_eq!(
            deliver(&mut conn, "a", id, false).unwrap(),
            Outcome::Processed(())
        );
    }

    let prune = Prune::new(policy(7 * DAY, DAY)).batch_size(100);
    let report = prune.run(&mut conn).unwrap();
    assert_eq!(report.rows_deleted, 230 + 120 + 5, "{report}");
    assert_eq!(
        report.batches, 6,
        "100 + 100 + 100 + 55, one over the failure records and one over the outbox: {report}"
    );
    assert!(report.caught_up, "{report}");

    let mut kept = set(&just_inside);
    kept.extend(fresh.iter().cloned());
    assert_eq!(stored_ids(&mut conn, "a"), kept);
    assert!(stored_ids(&mut conn, "b").is_empty());

    // Nothing left to do: one empty batch per table.
    let again = prune.run(&mut conn).unwrap();
    assert_eq!(
        (again.rows_deleted, again.batches, again.caught_up),
        (0, 3, true)
    );
    assert_eq!(count(&mut conn), 25);

    // The kept ids still deduplicate; a pruned one is processed again.
    assert_eq!(
        deliver(&mut conn, "a", "fresh-0", false).unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(
        deliver(&mut conn, "a", "edge-in-0", false).unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(
        deliver(&mut conn, "a", "old-a-0", false).unwrap(),
        Outcome::Processed(())
    );
}

pub fn handler_windows_and_scopes<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    seed::<B>(&mut conn, "a", &ids("a10", 50), Some(10 * DAY));
    seed::<B>(&mut conn, "b", &ids("b10", 50), Some(10 * DAY));
    seed::<B>(&mut conn, "b", &ids("b40", 20), Some(40 * DAY));
    seed::<B>(&mut conn, "c", &ids("c10", 30), Some(10 * DAY));
    seed::<B>(&mut conn, "c", &ids("c1", 10), Some(DAY));

    // `b` keeps its ids for 30 days, everybody else for 7.
    let policy = policy(7 * DAY, DAY).with_handler(handler("b"), secs(30 * DAY));

    // Restricted to `a`: only a's expired rows go.
    let only_a = Prune::new(policy.clone().only(handler("a"))).batch_size(40);
    let report = only_a.run(&mut conn).unwrap();
    assert_eq!(
        (report.rows_deleted, report.batches),
        (50, 3),
        "40 + 10, and one over the failure records: {report}"
    );
    assert!(stored_ids(&mut conn, "a").is_empty());
    assert_eq!(stored_ids(&mut conn, "b").len(), 70);
    assert_eq!(stored_ids(&mut conn, "c").len(), 40);

    // The whole policy: b by its own window, the rest by the default one.
    let prune = Prune::new(policy).batch_size(40);
    let mut scopes = Vec::new();
    let report = prune
        .run_with_progress(&mut conn, |batch| {
            if batch.table == PrunedTable::Claims {
                scopes.push((batch.scope.to_string(), batch.rows));
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(report.rows_deleted, 20 + 30, "{report}");
    // Everybody else's pass walks the handlers one by one (`a` has no row
    // left, `b` is skipped), each through its own index range.
    assert_eq!(
        scopes,
        [
            ("handler `b`".to_owned(), 20),
            ("handler `c`".to_owned(), 30)
        ]
    );
    assert_eq!(stored_ids(&mut conn, "b"), set(&ids("b10", 50)));
    assert_eq!(stored_ids(&mut conn, "c"), set(&ids("c1", 10)));
    assert!(report.caught_up);
}

pub fn progress_and_limits<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("old", 250), Some(30 * DAY));
    let prune = Prune::new(policy(7 * DAY, DAY)).batch_size(100);

    // A cap on batches: stops early, says so.
    let report = prune.clone().max_batches(2).run(&mut conn).unwrap();
    assert_eq!(
        (report.rows_deleted, report.batches, report.caught_up),
        (200, 2, false)
    );

    // Progress after every batch; `Break` stops the run.
    seed::<B>(&mut conn, "h", &ids("older", 250), Some(40 * DAY));
    let mut seen = Vec::new();
    let report = prune
        .run_with_progress(&mut conn, |batch| {
            seen.push((batch.batch, batch.rows, batch.total_rows));
            assert!(
                batch
                    .to_string()
                    .starts_with(&format!("batch {}: deleted", batch.batch))
            );
            assert_eq!(batch.scope, PruneScope::All);
            if batch.batch == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(seen, [(1, 100, 100), (2, 100, 200)]);
    assert!(!report.caught_up);
    assert_eq!(count(&mut conn), 100);
    // Oldest first: the 40-day rows went before the 30-day ones.
    let left = stored_ids(&mut conn, "h");
    assert_eq!(left.iter().filter(|id| id.starts_with("old-")).count(), 50);

    let report = prune.run(&mut conn).unwrap();
    assert_eq!((report.rows_deleted, report.caught_up), (100, true));
    assert_eq!(count(&mut conn), 0);
}

pub fn refuses_to_run_inside_a_transaction<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("old", 3), Some(30 * DAY));
    let prune = Prune::new(policy(7 * DAY, DAY));
    let result = conn.transaction(|conn| Ok::<_, diesel::result::Error>(prune.run(conn)));
    let err = result.unwrap().unwrap_err();
    assert!(
        matches!(
            err.error(),
            InboxError::Database(diesel::result::Error::AlreadyInTransaction)
        ),
        "{err}"
    );
    assert_eq!(count(&mut conn), 3, "nothing was deleted");
}

/// The longest window accepted (a hundred years) works on every backend's
/// clock arithmetic without overflow, and a window with a fraction of a
/// second is measured to the microsecond (bound as such), not rounded to
/// days or seconds.
pub fn extreme_and_fractional_windows<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let max = MAX_RETENTION.as_secs() as i64;
    seed::<B>(
        &mut conn,
        "h",
        &ids("older-than-max", 3),
        Some(max + 2 * DAY),
    );
    seed::<B>(&mut conn, "h", &ids("inside-max", 4), Some(max - 2 * DAY));
    let longest = RetentionPolicy::new(MAX_RETENTION, secs(DAY)).unwrap();
    let report = Prune::new(longest).run(&mut conn).unwrap();
    assert_eq!(report.rows_deleted, 3, "{report}");
    assert_eq!(count(&mut conn), 4);

    // 7 days and 0.25 s: 7 days + 2 minutes ago is out, 7 days - 2 minutes
    // ago is in.
    seed::<B>(&mut conn, "h", &ids("out", 5), Some(7 * DAY + 120));
    seed::<B>(&mut conn, "h", &ids("in", 6), Some(7 * DAY - 120));
    let keep = secs(7 * DAY) + std::time::Duration::from_micros(250_000);
    let fractional = RetentionPolicy::new(keep, secs(DAY)).unwrap();
    let prune = Prune::new(fractional);
    assert_eq!(prune.statements()[0].keep(), keep);
    let report = prune.run(&mut conn).unwrap();
    assert_eq!(
        report.rows_deleted,
        4 + 5,
        "the century-old rows and `out`: {report}"
    );
    assert_eq!(stored_ids(&mut conn, "h"), set(&ids("in", 6)));
}
