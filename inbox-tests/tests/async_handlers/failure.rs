//! `async_failure_tests!`: the failure paths of async handlers, expanded
//! after `async_suite!` in each backend's module (which defines `Conn`,
//! `Database`, the helpers, and the backend's constants
//! `FAILED_STATEMENT_ABORTS_TRANSACTION`, `CONNECTION_ID_SQL` and
//! `lock_waiters_sql`).

macro_rules! async_failure_tests {
    () => {
        /// Opens a diesel-async transaction inside the body and, when asked,
        /// panics inside it: diesel-async's `transaction` has no unwind
        /// guard, so its savepoint is still open when the panic reaches the
        /// handler.
        #[idempotent(id = msg.id, handler = "async.nested_transaction")]
        async fn nested_transaction(conn: &mut Conn, msg: &Msg) -> Result<(), AppError> {
            write_effect(conn, &msg.id, 1).await?;
            conn.transaction(async |conn| {
                write_effect(conn, &msg.id, 2).await?;
                if msg.panic {
                    panic!("deliberate panic inside a nested transaction");
                }
                Ok::<_, AppError>(())
            })
            .await
        }

        /// Ignores a failed statement, then reports success.
        #[idempotent(id = msg.id, handler = "async.swallow")]
        async fn swallows_a_failure(conn: &mut Conn, msg: &Msg) -> Result<Outcome<()>, AppError> {
            write_effect(conn, &msg.id, 1).await?;
            let _ = diesel::sql_query("SELECT no_such_column FROM no_such_table")
                .execute(conn)
                .await;
            let _ = write_effect(conn, &msg.id, 2).await;
            Ok(Outcome::Processed(()))
        }

        fn depth(conn: &mut Conn) -> u32 {
            <<Conn as AsyncConnection>::TransactionManager as diesel_async::TransactionManager<
                Conn,
            >>::transaction_manager_status_mut(conn)
            .transaction_depth()
            .expect("the transaction manager is not broken")
            .map_or(0, std::num::NonZeroU32::get)
        }

        async fn connection_id(conn: &mut Conn) -> i64 {
            diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                CONNECTION_ID_SQL,
            ))
            .get_result(conn)
            .await
            .expect("read the connection id")
        }

        /// Waits until `count` of the connections `ids` are inside their claim
        /// statement, behind the holder's lock.
        async fn wait_for_lock_waiters(observer: &mut Conn, ids: &[i64], count: i64) {
            let deadline = Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let waiting: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                    &lock_waiters_sql(ids),
                ))
                .get_result(observer)
                .await
                .expect("read the lock waits");
                if waiting >= count {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "{ids:?} never waited for the claim"
                );
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }

        #[tokio::test]
        async fn a_panic_inside_a_nested_transaction_rolls_back_the_handler() {
            let Some((_db, mut conn)) = fresh().await else {
                return;
            };
            let doomed = Msg::new("np-1").panicking();
            let caught = std::panic::AssertUnwindSafe(nested_transaction(&mut conn, &doomed))
                .catch_unwind()
                .await;
            assert!(caught.is_err(), "the panic is resumed");
            assert_eq!(depth(&mut conn), 0, "the handler's transaction is closed");
            assert_eq!(effects(&mut conn, "np-1").await, 0);
            assert_eq!(
                claims(&mut conn, "async.nested_transaction", "np-1").await,
                0
            );

            // The next delivery on the same connection commits for real.
            let mut observer = Conn::establish(_db.url()).await.expect("connect");
            let next = Msg::new("np-2");
            assert_eq!(
                record(&mut conn, &next).await.unwrap(),
                Outcome::Processed(0)
            );
            assert_eq!(effects(&mut observer, "np-2").await, 1, "committed");
            let redelivery = Msg::new("np-1");
            nested_transaction(&mut conn, &redelivery)
                .await
                .expect("the redelivery");
            assert_eq!(
                effects(&mut observer, "np-1").await,
                2,
                "both effects, once"
            );
        }

        #[tokio::test]
        async fn a_panic_inside_a_nested_transaction_returns_to_the_callers_level() {
            let Some((db, mut conn)) = fresh().await else {
                return;
            };
            let doomed = Msg::new("np-3").panicking();
            conn.transaction(async |conn| {
                write_effect(conn, "outer", 0).await?;
                let caught = std::panic::AssertUnwindSafe(nested_transaction(conn, &doomed))
                    .catch_unwind()
                    .await;
                assert!(caught.is_err(), "the panic is resumed");
                assert_eq!(depth(conn), 1, "back at the caller's transaction");
                write_effect(conn, "outer", 1).await?;
                Ok::<_, AppError>(())
            })
            .await
            .expect("the caller's transaction commits");
            let mut observer = connect(&db).await;
            assert_eq!(
                effects(&mut observer, "outer").await,
                2,
                "the caller's work committed"
            );
            assert_eq!(
                effects(&mut observer, "np-3").await,
                0,
                "the handler's did not"
            );
            assert_eq!(
                claims(&mut observer, "async.nested_transaction", "np-3").await,
                0
            );
        }

        #[tokio::test]
        async fn an_ignored_failed_statement_never_reports_uncommitted_work_as_done() {
            let Some((db, mut conn)) = fresh().await else {
                return;
            };
            let mut observer = connect(&db).await;
            let result = swallows_a_failure(&mut conn, &Msg::new("sw-1")).await;
            assert_eq!(depth(&mut conn), 0);
            if FAILED_STATEMENT_ABORTS_TRANSACTION {
                let error = result.expect_err("uncommitted work must not be reported as done");
                assert!(
                    matches!(
                        error.inbox(),
                        Some(InboxError::IgnoredStatementFailure { .. })
                    ),
                    "{error:?}"
                );
                assert_eq!(effects(&mut observer, "sw-1").await, 0);
                assert_eq!(claims(&mut observer, "async.swallow", "sw-1").await, 0);
                let again = swallows_a_failure(&mut conn, &Msg::new("sw-1"))
                    .await
                    .expect_err("every delivery of this body fails the same way");
                assert!(
                    matches!(
                        again.inbox(),
                        Some(InboxError::IgnoredStatementFailure { .. })
                    ),
                    "{again:?}"
                );
            } else {
                assert_eq!(result.expect("committed"), Outcome::Processed(()));
                assert_eq!(effects(&mut observer, "sw-1").await, 2);
            }
            // The connection still works.
            assert_eq!(
                record(&mut conn, &Msg::new("sw-2")).await.unwrap(),
                Outcome::Processed(0)
            );
            assert_eq!(effects(&mut observer, "sw-2").await, 1);
        }

        /// Two deliveries wait on a claim that then rolls back. On
        /// MariaDB/MySQL the waiters deadlock on the key's gap lock and
        /// InnoDB rolls one back (error 1213, which diesel-async does not
        /// map): the runtime must retry that claim, not hand the deadlock to
        /// the caller.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn waiters_on_a_claim_that_rolls_back_both_complete() {
            let Some((db, mut observer)) = fresh().await else {
                return;
            };
            for round in 0..3 {
                let id = format!("waiters-{round}");
                let key = inbox_runtime::ClaimKey::new(
                    inbox_runtime::HandlerName::new("async.record").unwrap(),
                    &id,
                )
                .unwrap();
                let mut holder = connect(&db).await;
                let claimed = inbox_runtime::begin_claimed(&mut holder, &key)
                    .await
                    .expect("claim")
                    .expect("a new id");
                let mut waiters = Vec::new();
                let mut ids = Vec::new();
                for worker in 1..=2 {
                    let mut conn = connect(&db).await;
                    ids.push(connection_id(&mut conn).await);
                    let msg = Msg::new(id.clone()).by(worker);
                    waiters.push(tokio::spawn(async move { record(&mut conn, &msg).await }));
                }
                wait_for_lock_waiters(&mut observer, &ids, 2).await;
                claimed
                    .finish(Err::<(), AppError>(AppError::Rejected("the holder fails")))
                    .await
                    .expect_err("rolled back");
                let mut outcomes = Vec::new();
                for waiter in waiters {
                    outcomes.push(
                        waiter
                            .await
                            .expect("no panic")
                            .expect("no deadlock reaches the caller"),
                    );
                }
                outcomes.sort_by_key(|outcome| matches!(outcome, Outcome::Duplicate));
                assert!(matches!(outcomes[0], Outcome::Processed(_)), "{outcomes:?}");
                assert_eq!(outcomes[1], Outcome::Duplicate, "round {round}");
                assert_eq!(effects(&mut observer, &id).await, 1);
            }
        }
    };
}

/// `async_fault_tests!`: connections killed under async handlers, and (on
/// MariaDB/MySQL) a deadlock that rolls back the caller's whole transaction.
macro_rules! async_fault_tests {
    () => {
        /// A delivery whose body has its own connection killed by `killer`,
        /// then panics: the rollback after the panic fails too.
        struct Doomed {
            id: String,
            victim: i64,
            killer: tokio::sync::Mutex<Conn>,
        }

        #[idempotent(id = msg.id, handler = "async.killed_then_panics")]
        async fn killed_then_panics(conn: &mut Conn, msg: &Doomed) -> Result<(), AppError> {
            write_effect(conn, &msg.id, 1).await?;
            diesel::sql_query(kill_sql(msg.victim))
                .execute(&mut *msg.killer.lock().await)
                .await?;
            panic!("deliberate panic after the connection was killed");
        }

        #[tokio::test]
        async fn a_panic_is_resumed_even_when_the_rollback_fails() {
            let Some((db, mut conn)) = fresh().await else {
                return;
            };
            let doomed = Doomed {
                id: "kp-1".to_owned(),
                victim: connection_id(&mut conn).await,
                killer: tokio::sync::Mutex::new(connect(&db).await),
            };
            let caught = std::panic::AssertUnwindSafe(killed_then_panics(&mut conn, &doomed))
                .catch_unwind()
                .await;
            assert!(
                caught.is_err(),
                "the panic is resumed, not turned into an error"
            );
            match record(&mut conn, &Msg::new("kp-2")).await {
                Err(AppError::Db(diesel::result::Error::BrokenTransactionManager)) => {}
                other => panic!("the connection must refuse further work, got {other:?}"),
            }
            let mut observer = connect(&db).await;
            assert_eq!(effects(&mut observer, "kp-1").await, 0);
            assert_eq!(effects(&mut observer, "kp-2").await, 0);
            assert_eq!(
                claims(&mut observer, "async.killed_then_panics", "kp-1").await,
                0
            );
        }
    };
}

/// `async_deadlock_tests!` (MariaDB/MySQL): a deadlock whose victim is a
/// nested handler rolls back the caller's whole transaction.
macro_rules! async_deadlock_tests {
    () => {
        /// Waits until connection `id` waits for a row lock.
        async fn wait_for_row_lock_wait(observer: &mut Conn, id: i64) {
            let deadline = Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let waiting: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                    &row_lock_waiters_sql(id),
                ))
                .get_result(observer)
                .await
                .expect("read the lock waits");
                if waiting > 0 {
                    return;
                }
                assert!(Instant::now() < deadline, "connection {id} never waited for the row");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }

        /// Waits for `UPDATE locks … WHERE k = 2`, which another transaction
        /// holds while it waits for the caller.
        #[idempotent(id = msg.id, handler = "async.deadlock")]
        async fn takes_the_other_row(conn: &mut Conn, msg: &Msg) -> Result<(), AppError> {
            write_effect(conn, &msg.id, 1).await?;
            diesel::sql_query("UPDATE locks SET v = v + 1 WHERE k = 2")
                .execute(conn)
                .await?;
            Ok(())
        }

        /// The victim of a deadlock is a nested handler. InnoDB rolls back
        /// the caller's whole transaction: the handler says so, and the
        /// connection refuses further work (nothing may run in autocommit).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_deadlock_in_a_nested_handler_never_leaves_work_in_autocommit() {
            let Some((db, mut conn)) = fresh().await else { return };
            conn.batch_execute(
                "CREATE TABLE locks (k INT PRIMARY KEY, v INT NOT NULL);
                 INSERT INTO locks VALUES (1, 0), (2, 0);
                 CREATE TABLE ballast (n INT NOT NULL);",
            )
            .await
            .expect("create the lock table");
            let mut observer = connect(&db).await;
            let mut other = connect(&db).await;
            let other_id = connection_id(&mut other).await;
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
            assert!(outer.is_err(), "the caller's transaction does not commit: {outer:?}");
            drop(conn);
            assert_eq!(effects(&mut observer, "dl-1").await, 0, "no effect committed");
            assert_eq!(effects(&mut observer, "dl-2").await, 0, "nothing ran in autocommit");
            assert_eq!(claims(&mut observer, "async.deadlock", "dl-1").await, 0);
            assert_eq!(claims(&mut observer, "async.record", "dl-2").await, 0);
        }
    };
}
