//! `async_loss_tests!`: the consumer's diesel-async connection terminated
//! mid-body, between the body and `COMMIT` (the handler's own, and a
//! caller's transaction around the handler), held directly and taken from
//! deadpool and bb8. Expanded in each backend's `asynchronous` module, which
//! defines `Conn`, `Db`, `BACKEND`, `CONNECTION_ID_SQL`, `kill_sql` and
//! `alive_sql`.

macro_rules! async_loss_tests {
    () => {
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::time::{Duration, Instant};

        use diesel::prelude::*;
        use diesel_async::pooled_connection::{
            bb8, deadpool, AsyncDieselConnectionManager, ManagerConfig, PoolableConnection,
            RecyclingMethod,
        };
        use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
        use inbox_runtime::{idempotent, Outcome, Recovery};

        use $crate::support::*;

        /// Who kills the handler's connection, and when.
        pub struct Kill {
            at: KillAt,
            victim: i64,
            killer: tokio::sync::Mutex<Conn>,
        }

        /// A delivery; `kill` makes the body terminate its own connection.
        pub struct Delivery {
            id: String,
            kill: Option<Kill>,
            runs: AtomicU32,
        }

        impl Delivery {
            fn new(id: &str) -> Self {
                Delivery {
                    id: id.to_owned(),
                    kill: None,
                    runs: AtomicU32::new(0),
                }
            }

            fn doomed(id: &str, at: KillAt, victim: i64, killer: Conn) -> Self {
                Delivery {
                    kill: Some(Kill {
                        at,
                        victim,
                        killer: tokio::sync::Mutex::new(killer),
                    }),
                    ..Delivery::new(id)
                }
            }

            fn runs(&self) -> u32 {
                AtomicU32::load(&self.runs, Ordering::Relaxed)
            }

            async fn kill_if(&self, at: KillAt) {
                if let Some(kill) = self.kill.as_ref().filter(|kill| kill.at == at) {
                    terminate(&mut *kill.killer.lock().await, kill.victim).await;
                }
            }
        }

        /// Two effects; the connection is killed between them, or after the
        /// second (the body's last statement), as the delivery says.
        #[idempotent(id = msg.id, handler = "loss.apply_async")]
        async fn apply(conn: &mut Conn, msg: &Delivery) -> Result<Outcome<()>, AppError> {
            msg.runs.fetch_add(1, Ordering::Relaxed);
            effect(conn, &msg.id, "step 1").await?;
            msg.kill_if(KillAt::MidBody).await;
            effect(conn, &msg.id, "step 2").await?;
            msg.kill_if(KillAt::BeforeCommit).await;
            Ok(Outcome::Processed(()))
        }

        /// Delivers `msg`: on its own, or (`KillAt::CallerCommit`) inside a
        /// caller's transaction that kills the connection before committing.
        async fn deliver(conn: &mut Conn, msg: &Delivery) -> Result<Outcome<()>, AppError> {
            if msg.kill.as_ref().is_some_and(|kill| kill.at == KillAt::CallerCommit) {
                conn.transaction(async |conn| {
                    let outcome = apply(conn, msg).await?;
                    msg.kill_if(KillAt::CallerCommit).await;
                    Ok(outcome)
                })
                .await
            } else {
                apply(conn, msg).await
            }
        }

        async fn effect(conn: &mut Conn, id: &str, note: &str) -> QueryResult<()> {
            diesel::insert_into(loss_effects::table)
                .values((loss_effects::message_id.eq(id), loss_effects::note.eq(note)))
                .execute(conn)
                .await
                .map(drop)
        }

        /// Terminates server connection `victim` and waits (bounded) until
        /// the server no longer lists it.
        async fn terminate(killer: &mut Conn, victim: i64) {
            diesel::sql_query(kill_sql(victim))
                .execute(killer)
                .await
                .expect("kill the connection");
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let alive: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                    &alive_sql(victim),
                ))
                .get_result(killer)
                .await
                .expect("read the server's connections");
                if alive == 0 {
                    return;
                }
                assert!(Instant::now() < deadline, "connection {victim} outlived its kill");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }

        async fn connection_id(conn: &mut Conn) -> i64 {
            diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(CONNECTION_ID_SQL))
                .get_result(conn)
                .await
                .expect("read the connection id")
        }

        async fn connect(db: &Db) -> Conn {
            Conn::establish(db.url()).await.expect("connect")
        }

        async fn fresh() -> Option<(Db, Conn)> {
            let db = Db::open()?;
            let mut conn = connect(&db).await;
            conn.batch_execute(EFFECTS_DDL)
                .await
                .expect("create the effects table");
            Some((db, conn))
        }

        /// `(inbox rows, effects)` of `id`, read on a connection of its own.
        async fn committed(db: &Db, id: &str) -> (i64, Vec<String>) {
            let mut conn = connect(db).await;
            let claims: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                &format!("(SELECT COUNT(*) FROM inbox_messages WHERE message_id = '{id}')"),
            ))
            .get_result(&mut conn)
            .await
            .expect("count the inbox");
            let mut notes: Vec<String> = loss_effects::table
                .filter(loss_effects::message_id.eq(id))
                .select(loss_effects::note)
                .load(&mut conn)
                .await
                .expect("read the effects");
            notes.sort();
            (claims, notes)
        }

        async fn check_loss(db: &Db, how: &str, error: &AppError, id: &str) {
            println!("{BACKEND} async {how}: {error:?} -> {:?}", classify(error));
            assert_eq!(classify(error), Recovery::Reconnect, "{how}: {error:?}");
            assert_eq!(committed(db, id).await, (0, vec![]), "{how}: nothing committed");
        }

        async fn redeliver_once(db: &Db, next: &mut Conn, id: &str) {
            let redelivery = Delivery::new(id);
            assert_eq!(
                apply(next, &redelivery).await.expect("the redelivery"),
                Outcome::Processed(())
            );
            assert_eq!(
                apply(next, &redelivery).await.expect("a duplicate"),
                Outcome::Duplicate
            );
            assert_eq!(redelivery.runs(), 1);
            assert_eq!(
                committed(db, id).await,
                (1, vec!["step 1".to_owned(), "step 2".to_owned()]),
                "the redelivery's effects, once"
            );
        }

        /// A later delivery and a plain transaction on the killed
        /// connection fail at once, each with a Reconnect.
        async fn later_work_fails_fast(conn: &mut Conn, how: &str) {
            let later = Delivery::new("after-the-kill");
            let result = tokio::time::timeout(HANG, apply(conn, &later))
                .await
                .unwrap_or_else(|_| panic!("{how}: a delivery on the killed connection hung"));
            let plain = tokio::time::timeout(
                HANG,
                conn.transaction(async |conn| {
                    diesel::select(diesel::dsl::sql::<diesel::sql_types::Integer>("1"))
                        .get_result::<i32>(conn)
                        .await
                }),
            )
            .await
            .unwrap_or_else(|_| panic!("{how}: a transaction on the killed connection hung"));
            let later_error = result.expect_err("the killed connection refuses a delivery");
            let plain = plain.expect_err("the killed connection refuses a transaction");
            println!("{BACKEND} async {how}: then {later_error:?} and {plain:?}");
            assert_eq!(later.runs(), 0, "{how}: no body ran on the killed connection");
            assert_eq!(classify(&later_error), Recovery::Reconnect, "{how}: {later_error:?}");
            assert_eq!(inbox_runtime::recovery(&plain), Recovery::Reconnect, "{how}: {plain:?}");
        }

        async fn lose_direct(at: KillAt) {
            let Some((db, mut conn)) = fresh().await else {
                return;
            };
            let how = format!("{at:?}");
            let id = format!("direct-{at:?}");
            let victim = connection_id(&mut conn).await;
            let doomed = Delivery::doomed(&id, at, victim, connect(&db).await);
            let error = deliver(&mut conn, &doomed)
                .await
                .expect_err("the connection was killed");
            assert_eq!(doomed.runs(), 1);
            check_loss(&db, &how, &error, &id).await;
            later_work_fails_fast(&mut conn, &how).await;
            redeliver_once(&db, &mut connect(&db).await, &id).await;
        }

        #[tokio::test]
        async fn killed_mid_body_says_reconnect_and_the_connection_fails_fast() {
            lose_direct(KillAt::MidBody).await;
        }

        #[tokio::test]
        async fn killed_between_body_and_commit_says_reconnect_and_the_connection_fails_fast() {
            lose_direct(KillAt::BeforeCommit).await;
        }

        #[tokio::test]
        async fn killed_before_the_callers_commit_says_reconnect_and_the_connection_fails_fast() {
            lose_direct(KillAt::CallerCommit).await;
        }

        /// Whether the pool's own checks let the dead connection back in
        /// (then shown, and the caller told to go on): `broken` is what the
        /// pool's `is_broken` check answered when the connection came back,
        /// `verifies` whether the pool also runs `SELECT 1`.
        ///
        /// The inbox marks the transaction manager broken whenever its own
        /// transaction is lost, so `is_broken` catches every failure of the
        /// handler's transaction. A failure of the *caller's* COMMIT is
        /// diesel-async's: on PostgreSQL `is_broken` still sees the closed
        /// socket, but `AsyncMysqlConnection` has no such check and
        /// diesel-async leaves its transaction manager valid, so a pool that
        /// does not verify (`RecyclingMethod::Fast`, bb8 with
        /// `test_on_check_out(false)`) hands the dead connection back, for
        /// ever: every delivery on it fails with Reconnect. The defaults
        /// (`Verified`, `test_on_check_out(true)`) discard it.
        async fn handed_back<P, F, E>(
            how: &str,
            at: KillAt,
            broken: bool,
            verifies: bool,
            checkout: impl FnOnce() -> F,
        ) -> bool
        where
            F: std::future::Future<Output = Result<P, E>>,
            P: std::ops::DerefMut<Target = Conn>,
            E: std::fmt::Debug,
        {
            if at != KillAt::CallerCommit {
                assert!(broken, "{how}: the inbox marks a lost transaction's connection broken");
            }
            if broken || verifies {
                return false;
            }
            assert!(
                BACKEND == "mysql" && at == KillAt::CallerCommit,
                "{how}: the pool cannot see the dead connection"
            );
            let mut again = tokio::time::timeout(HANG, checkout())
                .await
                .unwrap_or_else(|_| panic!("{how}: the checkout hung"))
                .expect("a checkout");
            let error = apply(&mut again, &Delivery::new("handed-back"))
                .await
                .expect_err("the dead connection, handed back");
            println!("{BACKEND} async {how}: KNOWN GAP: the pool handed the dead connection back: {error:?}");
            assert_eq!(classify(&error), Recovery::Reconnect, "{how}: {error:?}");
            true
        }

        /// A deadpool pool of one, with each recycling method: `Fast`
        /// checks only `PoolableConnection::is_broken` (the transaction
        /// manager; on PostgreSQL also whether the socket is closed),
        /// `Verified` also runs `SELECT 1`.
        async fn lose_deadpool(at: KillAt) {
            let Some((db, _conn)) = fresh().await else {
                return;
            };
            for (method_name, method, verifies) in [
                ("Fast", RecyclingMethod::Fast, false),
                ("Verified", RecyclingMethod::Verified, true),
            ] {
                let mut config = ManagerConfig::default();
                config.recycling_method = method;
                let manager = AsyncDieselConnectionManager::<Conn>::new_with_config(db.url(), config);
                let pool = deadpool::Pool::builder(manager)
                    .max_size(1)
                    .build()
                    .expect("build a deadpool pool");
                let how = format!("{at:?} deadpool {method_name}");
                let id = format!("deadpool-{at:?}-{method_name}");
                let mut object = pool.get().await.expect("a connection");
                let victim = connection_id(&mut object).await;
                let doomed = Delivery::doomed(&id, at, victim, connect(&db).await);
                let error = deliver(&mut object, &doomed)
                    .await
                    .expect_err("the connection was killed");
                check_loss(&db, &how, &error, &id).await;
                let broken = PoolableConnection::is_broken(&mut *object);
                drop(object);
                if handed_back(&how, at, broken, verifies, || pool.get()).await {
                    continue;
                }

                let mut next = tokio::time::timeout(HANG, pool.get())
                    .await
                    .unwrap_or_else(|_| panic!("{how}: the next checkout hung"))
                    .expect("the pool hands out a working connection");
                let replacement = connection_id(&mut next).await;
                println!(
                    "{BACKEND} async {how}: connection {victim} discarded by recycle, \
                     connection {replacement} handed out ({:?})",
                    pool.status()
                );
                assert_ne!(replacement, victim, "{how}: a new connection");
                redeliver_once(&db, &mut next, &id).await;
            }
        }

        /// A bb8 pool of one: `has_broken` (the transaction manager; on
        /// PostgreSQL also whether the socket is closed) runs when the
        /// connection comes back; `test_on_check_out` adds `SELECT 1`.
        async fn lose_bb8(at: KillAt) {
            let Some((db, _conn)) = fresh().await else {
                return;
            };
            for test_on_check_out in [false, true] {
                let pool = bb8::Pool::builder()
                    .max_size(1)
                    .test_on_check_out(test_on_check_out)
                    .connection_timeout(HANG)
                    .build(AsyncDieselConnectionManager::<Conn>::new(db.url()))
                    .await
                    .expect("build a bb8 pool");
                let how = format!("{at:?} bb8 test_on_check_out={test_on_check_out}");
                let id = format!("bb8-{at:?}-{test_on_check_out}");
                let mut pooled = pool.get().await.expect("a connection");
                let victim = connection_id(&mut pooled).await;
                let doomed = Delivery::doomed(&id, at, victim, connect(&db).await);
                let error = deliver(&mut pooled, &doomed)
                    .await
                    .expect_err("the connection was killed");
                check_loss(&db, &how, &error, &id).await;
                let broken = PoolableConnection::is_broken(&mut *pooled);
                drop(pooled);
                if handed_back(&how, at, broken, test_on_check_out, || pool.get()).await {
                    continue;
                }

                let mut next = pool.get().await.expect("the pool hands out a working connection");
                let replacement = connection_id(&mut next).await;
                println!(
                    "{BACKEND} async {how}: connection {victim} discarded by has_broken, \
                     connection {replacement} handed out ({:?})",
                    pool.state()
                );
                assert_ne!(replacement, victim, "{how}: a new connection");
                redeliver_once(&db, &mut next, &id).await;
            }
        }

        #[tokio::test]
        async fn deadpool_never_hands_back_a_connection_killed_mid_body() {
            lose_deadpool(KillAt::MidBody).await;
        }

        #[tokio::test]
        async fn deadpool_never_hands_back_a_connection_killed_before_commit() {
            lose_deadpool(KillAt::BeforeCommit).await;
        }

        #[tokio::test]
        async fn deadpool_never_hands_back_a_connection_killed_before_the_callers_commit() {
            lose_deadpool(KillAt::CallerCommit).await;
        }

        #[tokio::test]
        async fn bb8_never_hands_back_a_connection_killed_before_the_callers_commit() {
            lose_bb8(KillAt::CallerCommit).await;
        }

        #[tokio::test]
        async fn bb8_never_hands_back_a_connection_killed_mid_body() {
            lose_bb8(KillAt::MidBody).await;
        }

        #[tokio::test]
        async fn bb8_never_hands_back_a_connection_killed_before_commit() {
            lose_bb8(KillAt::BeforeCommit).await;
        }
    };
}
