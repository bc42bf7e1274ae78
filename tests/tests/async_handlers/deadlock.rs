//! MariaDB/MySQL: a deadlock whose victim is a nested handler rolls back
//! the caller's whole transaction.

#[cfg(feature = "mysql")]
mod mysql {
    use std::time::{Duration, Instant};

    use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
    use inbox_runtime::{InboxError, idempotent};
    use inbox_tests::{AppError, AsyncSqlRows, Mysql, TestBackend};

    use crate::handlers::*;
    use crate::support::*;

    /// Waits for `UPDATE locks … WHERE k = 2`, which another transaction holds
    /// while it waits for the caller.
    #[idempotent(id = msg.id, handler = "async.deadlock")]
    async fn takes_the_other_row(
        conn: &mut AsyncMysqlConnection,
        msg: &Msg,
    ) -> Result<(), AppError> {
        write_effect(conn, &msg.id, 1).await?;
        diesel::sql_query("UPDATE locks SET v = v + 1 WHERE k = 2")
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Waits until connection `id` is inside its `UPDATE locks …`: behind
    /// the caller's row lock, which it cannot pass before the caller ends.
    /// (InnoDB's `INNODB_TRX` does not list every waiting transaction of a
    /// diesel-async connection as `LOCK WAIT`.)
    async fn wait_for_row_lock_wait(observer: &mut AsyncMysqlConnection, id: i64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let waiting = observer
                .bigint(&format!(
                    "SELECT COUNT(*) AS value FROM information_schema.PROCESSLIST \
                     WHERE id = {id} AND info LIKE 'UPDATE locks%'"
                ))
                .await;
            if waiting > 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "connection {id} never waited for the row"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The victim of a deadlock is a nested handler. InnoDB rolls back
    /// the caller's whole transaction: the handler says so, and the
    /// connection refuses further work (nothing may run in autocommit).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deadlock_in_a_nested_handler_never_leaves_work_in_autocommit() {
        let Some((db, mut conn)) = fresh::<Mysql>().await else {
            return;
        };
        conn.batch_execute(
            "CREATE TABLE locks (k INT PRIMARY KEY, v INT NOT NULL);
             INSERT INTO locks VALUES (1, 0), (2, 0);
             CREATE TABLE ballast (n INT NOT NULL);",
        )
        .await
        .expect("create the lock table");
        let mut observer = db.connect_async().await;
        let mut other = db.connect_async().await;
        let other_id = inbox_tests::connection_id_async::<Mysql>(&mut other).await;
        let deadlocked = Msg::new("dl-1");
        let next = Msg::new("dl-2").failing();

        let outer = conn
            .transaction(async |conn| {
                diesel::sql_query("UPDATE locks SET v = v + 1 WHERE k = 1")
                    .execute(conn)
                    .await?;
                // The other transaction holds row 2, is heavier (InnoDB
                // rolls back the lighter one), then waits for row 1.
                let (held, holding) = tokio::sync::oneshot::channel();
                let contender = tokio::spawn(async move {
                    other
                        .transaction(async |other| {
                            diesel::sql_query("UPDATE locks SET v = v + 1 WHERE k = 2")
                                .execute(other)
                                .await?;
                            diesel::sql_query(
                                "INSERT INTO ballast WITH RECURSIVE s (n) AS \
                                 (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 200) SELECT n FROM s",
                            )
                            .execute(other)
                            .await?;
                            held.send(()).expect("the test listens");
                            diesel::sql_query("UPDATE locks SET v = v + 1 WHERE k = 1")
                                .execute(other)
                                .await?;
                            diesel::QueryResult::Ok(())
                        })
                        .await
                });
                holding.await.expect("the other transaction holds row 2");
                let waiting = tokio::time::timeout(
                    std::time::Duration::from_secs(20),
                    wait_for_row_lock_wait(&mut observer, other_id),
                )
                .await;
                if waiting.is_err() {
                    panic!("the other transaction never waited: {:?}", contender.await);
                }

                let result = takes_the_other_row(conn, &deadlocked).await;
                let error = result.expect_err("the lighter transaction is the deadlock's victim");
                assert!(
                    matches!(error.inbox(), Some(InboxError::TransactionLost { nested: true, .. })),
                    "the handler says the caller's transaction is gone: {error:?}"
                );
                contender.await.expect("no panic").expect("the other transaction commits");
                match record(conn, &next).await {
                    Err(AppError::Db(diesel::result::Error::BrokenTransactionManager)) => {}
                    other => panic!("the connection must refuse further work, got {other:?}"),
                }
                Ok::<(), AppError>(())
            })
            .await;
        assert!(
            outer.is_err(),
            "the caller's transaction does not commit: {outer:?}"
        );
        drop(conn);
        assert_eq!(
            effects(&mut observer, "dl-1").await,
            0,
            "no effect committed"
        );
        assert_eq!(
            effects(&mut observer, "dl-2").await,
            0,
            "nothing ran in autocommit"
        );
        assert_eq!(claims(&mut observer, "async.deadlock", "dl-1").await, 0);
        assert_eq!(claims(&mut observer, "async.record", "dl-2").await, 0);
    }
}
