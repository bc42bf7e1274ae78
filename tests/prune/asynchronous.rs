//! `Prune::run_async` on diesel-async connections: the same batches and
//! report as the blocking run.

#![cfg(feature = "async")]

use std::ops::ControlFlow;

use diesel_async::AsyncConnection;
use inbox_runtime::{InboxError, Prune};

use crate::common::*;

/// Seeds 250 expired and 5 fresh ids with the blocking connection, prunes
/// asynchronously in batches of 100.
async fn prunes_in_batches<D, A>(db: &D, url: &str)
where
    D: PruneDb,
    A: AsyncConnection<Backend: inbox_runtime::InboxBackend>,
{
    let mut conn = db.connect();
    seed::<D>(&mut conn, "h", &ids("old", 250), Some(30 * DAY));
    seed::<D>(&mut conn, "h", &ids("new", 5), None);
    let mut async_conn = A::establish(url).await.expect("connect");
    let prune = Prune::new(policy(7 * DAY, DAY)).batch_size(100).unwrap();

    let mut batches = Vec::new();
    let report = prune
        .run_async_with_progress(&mut async_conn, |batch| {
            batches.push(batch.rows);
            ControlFlow::Continue(())
        })
        .await
        .unwrap();
    assert_eq!(batches, [100, 100, 50]);
    assert_eq!(
        (report.rows_deleted, report.batches, report.caught_up),
        (250, 3, true)
    );
    assert_eq!(D::stored_ids(&mut conn, "h"), set(&ids("new", 5)));

    // A cap on batches, and nothing left: one empty batch.
    seed::<D>(&mut conn, "h", &ids("older", 30), Some(30 * DAY));
    let report = prune
        .clone()
        .max_batches(1)
        .run_async(&mut async_conn)
        .await
        .unwrap();
    assert_eq!((report.rows_deleted, report.caught_up), (30, true));

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

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_run_async() {
    use inbox_suite::testdb::{PgDatabase, TestDatabase as _};
    if let Some(db) = PgDatabase::open() {
        let url = db.url().to_owned();
        prunes_in_batches::<_, diesel_async::AsyncPgConnection>(&db, &url).await;
    }
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_run_async() {
    use inbox_suite::testdb::{MysqlDatabase, TestDatabase as _};
    if let Some(db) = MysqlDatabase::open() {
        let url = db.url().to_owned();
        prunes_in_batches::<_, diesel_async::AsyncMysqlConnection>(&db, &url).await;
    }
}

/// Rows held by a transaction still open survive an async prune too (see
/// `open_transactions`), which does not wait for them.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn held_rows_survive_run_async<D, A>(db: &D, duplicate_is_locked: bool, url: &str)
where
    D: PruneDb,
    A: AsyncConnection<Backend: inbox_runtime::InboxBackend>,
{
    crate::open_transactions::held_rows_survive(db, duplicate_is_locked, |prune| {
        block_on(async {
            let mut conn = A::establish(url).await.expect("connect");
            prune.run_async(&mut conn).await
        })
    });
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_held_rows_survive_run_async() {
    use inbox_suite::testdb::{PgDatabase, TestDatabase as _};
    if let Some(db) = PgDatabase::open() {
        let url = db.url().to_owned();
        held_rows_survive_run_async::<_, diesel_async::AsyncPgConnection>(&db, false, &url);
    }
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_held_rows_survive_run_async() {
    use inbox_suite::testdb::{MysqlDatabase, TestDatabase as _};
    if let Some(db) = MysqlDatabase::open() {
        let url = db.url().to_owned();
        held_rows_survive_run_async::<_, diesel_async::AsyncMysqlConnection>(&db, true, &url);
    }
}

/// Runs `future` to completion on a runtime of its own.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}
