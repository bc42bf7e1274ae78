//! `Prune::run_async` on diesel-async connections: the same batches and
//! report as the blocking run.

#![cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]

use std::ops::ControlFlow;

use diesel_async::AsyncConnection;
use inbox_runtime::prune::PrunedTable;
use inbox_runtime::{InboxError, Prune};

use crate::support::*;

inbox_tests::backend_tests! {
    async only [postgres, mysql]: run_async;
    only [postgres, mysql]: held_rows_survive_run_async;
}

/// Seeds 250 expired and 5 fresh ids with the blocking connection, prunes
/// asynchronously in batches of 100.
pub async fn run_async<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("old", 250), Some(30 * DAY));
    seed::<B>(&mut conn, "h", &ids("new", 5), None);
    let mut async_conn = db.connect_async().await;
    let prune = Prune::new(policy(7 * DAY, DAY)).batch_size(100);

    let mut batches = Vec::new();
    let report = prune
        .run_async_with_progress(&mut async_conn, |batch| {
            if batch.table == PrunedTable::Claims {
                batches.push(batch.rows);
            }
            ControlFlow::Continue(())
        })
        .await
        .unwrap();
    assert_eq!(batches, [100, 100, 50]);
    assert_eq!(
        (report.rows_deleted, report.batches, report.caught_up),
        (250, 5, true),
        "three over the claims, one over the failure records, one over the outbox"
    );
    assert_eq!(stored_ids(&mut conn, "h"), set(&ids("new", 5)));

    // A cap on batches: one short batch per table catches up; one batch
    // in all leaves the failure records' and the outbox's passes undone.
    seed::<B>(&mut conn, "h", &ids("older", 30), Some(30 * DAY));
    let report = prune
        .clone()
        .max_batches(1)
        .run_async(&mut async_conn)
        .await
        .unwrap();
    assert_eq!((report.rows_deleted, report.caught_up), (30, false));
    let report = prune
        .clone()
        .max_batches(3)
        .run_async(&mut async_conn)
        .await
        .unwrap();
    assert_eq!((report.rows_deleted, report.caught_up), (0, true));

    // The pause between batches is taken, as by the blocking run: three
    // batches, two pauses (none after the short batch that ends the pass).
    seed::<B>(&mut conn, "h", &ids("paced", 250), Some(30 * DAY));
    let pause = std::time::Duration::from_millis(150);
    let report = prune
        .clone()
        .pause(pause)
        .run_async(&mut async_conn)
        .await
        .unwrap();
    assert_eq!((report.rows_deleted, report.batches), (250, 5));
    assert!(
        report.elapsed >= 2 * pause,
        "the pauses were skipped: {report}"
    );

    // A handler with a window of its own: everybody else's pass walks the
    // handlers one by one (each found by an index probe on this async
    // connection), skipping it.
    seed::<B>(&mut conn, "keep", &ids("kept", 40), Some(10 * DAY));
    seed::<B>(&mut conn, "a", &ids("old", 30), Some(10 * DAY));
    seed::<B>(&mut conn, "z", &ids("old", 20), Some(10 * DAY));
    let per_handler = policy(7 * DAY, DAY).with_handler(handler("keep"), secs(30 * DAY));
    let mut scopes = Vec::new();
    let report = Prune::new(per_handler)
        .batch_size(25)
        .run_async_with_progress(&mut async_conn, |batch| {
            if batch.table == PrunedTable::Claims {
                scopes.push((batch.scope.to_string(), batch.rows));
            }
            ControlFlow::Continue(())
        })
        .await
        .unwrap();
    assert_eq!(
        scopes,
        [
            ("handler `keep`".to_owned(), 0),
            ("handler `a`".to_owned(), 25),
            ("handler `a`".to_owned(), 5),
            ("handler `h`".to_owned(), 0),
            ("handler `z`".to_owned(), 20),
        ]
    );
    assert!(report.caught_up, "{report}");
    assert_eq!(stored_ids(&mut conn, "keep").len(), 40);
    assert!(stored_ids(&mut conn, "a").is_empty());
    assert!(stored_ids(&mut conn, "z").is_empty());

    // Refused inside a transaction.
    let refused = async_conn
        .transaction(async |conn| Ok::<_, diesel::result::Error>(prune.run_async(conn).await))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            refused.error(),
            InboxError::Database(diesel::result::Error::AlreadyInTransaction)
        ),
        "{refused}"
    );
}

/// Rows held by a transaction still open survive an async prune too (see
/// `open_transactions`), which does not wait for them.
pub fn held_rows_survive_run_async<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    crate::open_transactions::held_rows_survive_with(&db, |prune| {
        inbox_tests::runtime::current_thread().block_on(async {
            let mut conn = db.connect_async().await;
            prune.run_async(&mut conn).await
        })
    });
}
