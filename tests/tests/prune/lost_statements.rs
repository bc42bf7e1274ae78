//! PostgreSQL: a pruning run on a connection whose prepared statements the
//! server no longer has (`DEALLOCATE ALL`; PgBouncer's transaction pooling
//! with Diesel's statement cache on) fails with `Reconnect` and leaves the
//! connection broken, so that a pool replaces it instead of handing it to
//! every later run.

use diesel::connection::{AnsiTransactionManager, SimpleConnection as _, TransactionManager};
use inbox_runtime::{Prune, Recovery};

use crate::support::*;

inbox_tests::backend_tests!(only [postgres]:
    a_run_that_meets_dropped_statements_says_reconnect_and_breaks_the_connection,
);

pub fn a_run_that_meets_dropped_statements_says_reconnect_and_breaks_the_connection<
    B: TestBackend<Connection = diesel::PgConnection>,
>() {
    if B::skipped_without_sessions(
        "it drops a connection's cached statements, and behind PgBouncer the cache is off",
    ) {
        return;
    }
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    seed::<B>(&mut conn, "a", &ids("old", 30), Some(10 * DAY));
    let prune = Prune::new(policy(7 * DAY, DAY)).batch_size(10);
    let first = prune.run(&mut conn).unwrap();
    assert_eq!(first.rows_deleted, 30, "{first}");

    seed::<B>(&mut conn, "a", &ids("older", 30), Some(10 * DAY));
    conn.batch_execute("DEALLOCATE ALL").unwrap();
    let error = prune
        .run(&mut conn)
        .expect_err("the run's prepared statements are gone");
    println!("pruning after DEALLOCATE ALL: {error}");
    assert_eq!(error.error().recovery(), Recovery::Reconnect, "{error}");
    assert!(
        AnsiTransactionManager::transaction_manager_status_mut(&mut conn)
            .transaction_depth()
            .is_err(),
        "the connection is left broken for its pool"
    );
}
