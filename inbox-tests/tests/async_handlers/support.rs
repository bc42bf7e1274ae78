//! What the async suites share, and `async_suite!`, which expands the
//! handlers and tests for one backend's async connection type.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

diesel::table! {
    /// What handler bodies write: one row per applied effect, with no unique
    /// constraint, so a second effect for a message shows up as a second row.
    async_effects (message_id, worker) {
        message_id -> Text,
        worker -> Integer,
    }
}

/// Creates `async_effects`; valid on PostgreSQL and MariaDB alike.
pub const EFFECTS_DDL: &str =
    "CREATE TABLE async_effects (message_id VARCHAR(255) NOT NULL, worker INTEGER NOT NULL)";

pub use inbox_tests::AppError;

/// A delivered message and how its handler body should behave.
#[derive(Debug, Clone)]
pub struct Msg {
    pub id: String,
    pub worker: i32,
    pub fail: bool,
    pub panic: bool,
}

impl Msg {
    pub fn new(id: impl Into<String>) -> Self {
        Msg {
            id: id.into(),
            worker: 0,
            fail: false,
            panic: false,
        }
    }

    pub fn by(mut self, worker: i32) -> Self {
        self.worker = worker;
        self
    }

    pub fn failing(mut self) -> Self {
        self.fail = true;
        self
    }

    pub fn panicking(mut self) -> Self {
        self.panic = true;
        self
    }
}

/// Drives a future for at most `polls` polls that return `Pending`, then
/// drops it: a deterministic cancellation at the `polls`-th await point that
/// really waited (on the database).
pub struct CancelAfter<F> {
    inner: Option<Pin<Box<F>>>,
    pending_left: usize,
}

impl<F: Future> CancelAfter<F> {
    pub fn new(future: F, polls: usize) -> Self {
        CancelAfter {
            inner: Some(Box::pin(future)),
            pending_left: polls,
        }
    }
}

impl<F: Future> Future for CancelAfter<F> {
    /// `None` when the future was cancelled.
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match inner.as_mut().poll(cx) {
            Poll::Ready(output) => Poll::Ready(Some(output)),
            Poll::Pending if this.pending_left == 0 => {
                this.inner = None; // drop it mid-flight
                Poll::Ready(None)
            }
            Poll::Pending => {
                this.pending_left -= 1;
                Poll::Pending
            }
        }
    }
}

/// A std-only xorshift64 generator to shuffle delivery orders.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            items.swap(i, (self.0 % (i as u64 + 1)) as usize);
        }
    }
}

/// Requires `T: Send` at compile time.
pub fn assert_send<T: Send>(value: T) -> T {
    value
}

macro_rules! async_suite {
    ($conn:ty, $database:ty, $inbox:ident) => {
        use std::time::Instant;

        use diesel::prelude::*;
        use diesel_async::pooled_connection::{bb8, deadpool, AsyncDieselConnectionManager};
        use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
        use futures_util::FutureExt;
        use inbox_runtime::schema::$inbox::inbox_messages;
        use inbox_runtime::{idempotent, InboxError, Outcome};
        use inbox_tests::TestBackend as _;

        use $crate::support::*;

        type Conn = $conn;
        type Database = $database;

        /// Records one effect row, then behaves as the message asks.
        #[idempotent(id = msg.id, handler = "async.record")]
        async fn record(conn: &mut Conn, msg: &Msg) -> Result<Outcome<i32>, AppError> {
            write_effect(conn, &msg.id, msg.worker).await?;
            tokio::task::yield_now().await;
            if msg.fail {
                return Err(AppError::Rejected("the body failed"));
            }
            if msg.panic {
                panic!("deliberate panic in the body");
            }
            Ok(Outcome::Processed(msg.worker))
        }

        /// A second handler of the same messages, in its own scope, with
        /// Diesel's error type.
        #[idempotent(id = msg.id, handler = "async.audit")]
        async fn audit(conn: &mut Conn, msg: &Msg) -> Result<(), diesel::result::Error> {
            write_effect(conn, &msg.id, -1).await
        }

        /// The same handler on a deadpool connection.
        #[idempotent(id = msg.id, handler = "async.record")]
        async fn record_deadpool(
            conn: &mut deadpool::Object<Conn>,
            msg: &Msg,
        ) -> Result<Outcome<()>, AppError> {
            write_effect(conn, &msg.id, msg.worker).await?;
            Ok(Outcome::Processed(()))
        }

        /// The same handler on a bb8 connection taken by value.
        #[idempotent(id = msg.id, handler = "async.record")]
        async fn record_bb8(conn: bb8::PooledConnection<'_, Conn>, msg: &Msg) -> Result<(), AppError> {
            write_effect(conn, &msg.id, msg.worker).await?;
            Ok(())
        }

        async fn write_effect(conn: &mut Conn, message_id: &str, worker: i32) -> QueryResult<()> {
            diesel::insert_into(async_effects::table)
                .values((
                    async_effects::message_id.eq(message_id),
                    async_effects::worker.eq(worker),
                ))
                .execute(conn)
                .await
                .map(drop)
        }

        /// A fresh database with the effects table, and a connection to it.
        async fn fresh() -> Option<(Database, Conn)> {
            let db = Database::open()?;
            let mut conn = connect(&db).await;
            conn.batch_execute(EFFECTS_DDL)
                .await
                .expect("create the effects table");
            Some((db, conn))
        }

        async fn connect(db: &Database) -> Conn {
            Conn::establish(db.url()).await.expect("connect")
        }

        async fn effects(conn: &mut Conn, id: &str) -> i64 {
            async_effects::table
                .filter(async_effects::message_id.eq(id))
                .count()
                .get_result(conn)
                .await
                .expect("count effects")
        }

        async fn claims(conn: &mut Conn, handler: &str, id: &str) -> i64 {
            inbox_messages::table
                .filter(inbox_messages::handler.eq(handler))
                .filter(inbox_messages::message_id.eq(id))
                .count()
                .get_result(conn)
                .await
                .expect("count claims")
        }

        fn deadpool_pool(db: &Database, size: usize) -> deadpool::Pool<Conn> {
            deadpool::Pool::builder(AsyncDieselConnectionManager::<Conn>::new(db.url()))
                .max_size(size)
                .build()
                .expect("build a deadpool pool")
        }

        async fn bb8_pool(db: &Database, size: u32) -> bb8::Pool<Conn> {
            bb8::Pool::builder()
                .max_size(size)
                .build(AsyncDieselConnectionManager::<Conn>::new(db.url()))
                .await
                .expect("build a bb8 pool")
        }

        #[tokio::test]
        async fn processed_then_duplicate() {
            let Some((_db, mut conn)) = fresh().await else { return };
            let msg = Msg::new("m-1").by(7);
            assert_eq!(record(&mut conn, &msg).await.unwrap(), Outcome::Processed(7));
            assert_eq!(record(&mut conn, &msg).await.unwrap(), Outcome::Duplicate);
            assert_eq!(effects(&mut conn, "m-1").await, 1);
            assert_eq!(claims(&mut conn, "async.record", "m-1").await, 1);
        }

        #[tokio::test]
        async fn an_error_rolls_back_the_claim_and_a_retry_processes() {
            let Some((_db, mut conn)) = fresh().await else { return };
            let failing = Msg::new("m-err").failing();
            match record(&mut conn, &failing).await {
                Err(AppError::Rejected(why)) => assert_eq!(why, "the body failed"),
                other => panic!("expected the body's own error, got {other:?}"),
            }
            assert_eq!(effects(&mut conn, "m-err").await, 0);
            assert_eq!(claims(&mut conn, "async.record", "m-err").await, 0);
            let retry = Msg::new("m-err");
            assert_eq!(record(&mut conn, &retry).await.unwrap(), Outcome::Processed(0));
            assert_eq!(record(&mut conn, &retry).await.unwrap(), Outcome::Duplicate);
            assert_eq!(effects(&mut conn, "m-err").await, 1);
        }

        #[tokio::test]
        async fn a_panic_rolls_back_the_claim_and_a_retry_processes() {
            let Some((_db, mut conn)) = fresh().await else { return };
            let panicking = Msg::new("m-panic").panicking();
            let caught = std::panic::AssertUnwindSafe(record(&mut conn, &panicking))
                .catch_unwind()
                .await;
            assert!(caught.is_err(), "the panic is resumed after the rollback");
            assert_eq!(effects(&mut conn, "m-panic").await, 0);
            assert_eq!(claims(&mut conn, "async.record", "m-panic").await, 0);
            let retry = Msg::new("m-panic");
            assert_eq!(record(&mut conn, &retry).await.unwrap(), Outcome::Processed(0));
            assert_eq!(effects(&mut conn, "m-panic").await, 1);
        }

        #[tokio::test]
        async fn nested_in_an_outer_transaction_the_claim_follows_the_outer_outcome() {
            let Some((_db, mut conn)) = fresh().await else { return };
            let msg = Msg::new("m-nested");
            let rolled_back = conn
                .transaction(async |conn| {
                    assert_eq!(record(conn, &msg).await?, Outcome::Processed(0));
                    Err::<(), AppError>(AppError::Db(diesel::result::Error::RollbackTransaction))
                })
                .await;
            assert!(rolled_back.is_err());
            assert_eq!(effects(&mut conn, "m-nested").await, 0);
            assert_eq!(claims(&mut conn, "async.record", "m-nested").await, 0);

            conn.transaction(async |conn| {
                assert_eq!(record(conn, &msg).await?, Outcome::Processed(0));
                Ok::<(), AppError>(())
            })
            .await
            .unwrap();
            assert_eq!(record(&mut conn, &msg).await.unwrap(), Outcome::Duplicate);
            assert_eq!(effects(&mut conn, "m-nested").await, 1);
        }

        #[tokio::test]
        async fn two_handlers_each_process_the_same_message_once() {
            let Some((_db, mut conn)) = fresh().await else { return };
            let msg = Msg::new("fan-out").by(3);
            assert_eq!(record(&mut conn, &msg).await.unwrap(), Outcome::Processed(3));
            audit(&mut conn, &msg).await.unwrap();
            assert_eq!(record(&mut conn, &msg).await.unwrap(), Outcome::Duplicate);
            audit(&mut conn, &msg).await.unwrap();
            assert_eq!(effects(&mut conn, "fan-out").await, 2);
            assert_eq!(claims(&mut conn, "async.record", "fan-out").await, 1);
            assert_eq!(claims(&mut conn, "async.audit", "fan-out").await, 1);
        }

        #[tokio::test]
        async fn bad_ids_are_typed_errors_that_record_nothing() {
            let Some((_db, mut conn)) = fresh().await else { return };
            for bad in [String::new(), "x".repeat(256), "a\0b".to_owned()] {
                let msg = Msg::new(bad.clone());
                match record(&mut conn, &msg).await {
                    Err(AppError::Inbox(error @ InboxError::InvalidMessageId { .. })) => {
                        assert!(!error.is_retryable())
                    }
                    other => panic!("expected an invalid id error for {bad:?}, got {other:?}"),
                }
                let via_diesel = audit(&mut conn, &msg).await.unwrap_err();
                assert!(InboxError::find_in(&via_diesel).is_some_and(InboxError::is_invalid_message));
            }
            let total: i64 = async_effects::table.count().get_result(&mut conn).await.unwrap();
            let claimed: i64 = inbox_messages::table.count().get_result(&mut conn).await.unwrap();
            assert_eq!((total, claimed), (0, 0));
        }

        #[tokio::test]
        async fn deadpool_and_bb8_connections_work_as_handler_connections() {
            let Some((db, mut conn)) = fresh().await else { return };
            let deadpool = deadpool_pool(&db, 2);
            let bb8 = bb8_pool(&db, 2).await;
            let msg = Msg::new("pooled");
            let mut object = deadpool.get().await.unwrap();
            assert_eq!(record_deadpool(&mut object, &msg).await.unwrap(), Outcome::Processed(()));
            assert_eq!(record_deadpool(&mut object, &msg).await.unwrap(), Outcome::Duplicate);
            record_bb8(bb8.get().await.unwrap(), &msg).await.unwrap();
            record_bb8(bb8.get().await.unwrap(), &Msg::new("pooled-2")).await.unwrap();
            assert_eq!(effects(&mut conn, "pooled").await, 1);
            assert_eq!(effects(&mut conn, "pooled-2").await, 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn racing_tasks_apply_each_id_exactly_once() {
            const TASKS: usize = 16;
            const IDS: usize = 500;
            let Some((db, mut conn)) = fresh().await else { return };
            let pool = deadpool_pool(&db, TASKS);
            let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(TASKS));
            let started = Instant::now();
            let mut tasks = Vec::new();
            for worker in 0..TASKS {
                let pool = pool.clone();
                let barrier = barrier.clone();
                tasks.push(tokio::spawn(assert_send(async move {
                    let mut object = pool.get().await.expect("a pooled connection per task");
                    let mut order: Vec<usize> = (0..IDS).collect();
                    XorShift::new(worker as u64 + 1).shuffle(&mut order);
                    barrier.wait().await;
                    let (mut processed, mut duplicates) = (0_usize, 0_usize);
                    for i in order {
                        let msg = Msg::new(format!("race-{i}")).by(worker as i32);
                        match record_deadpool(&mut object, &msg).await {
                            Ok(Outcome::Processed(())) => processed += 1,
                            Ok(Outcome::Duplicate) => duplicates += 1,
                            Err(error) => panic!("task {worker} failed on {}: {error:?}", msg.id),
                        }
                    }
                    (processed, duplicates)
                })));
            }
            let (mut processed, mut duplicates) = (0, 0);
            for task in tasks {
                let (p, d) = task.await.expect("no task failed");
                processed += p;
                duplicates += d;
            }
            let elapsed = started.elapsed();
            let total: i64 = async_effects::table.count().get_result(&mut conn).await.unwrap();
            let ids: Vec<String> = async_effects::table
                .select(async_effects::message_id)
                .load(&mut conn)
                .await
                .unwrap();
            let distinct = ids.iter().collect::<std::collections::HashSet<_>>().len() as i64;
            let claimed: i64 = inbox_messages::table.count().get_result(&mut conn).await.unwrap();
            println!(
                "async race {}: tasks={TASKS} ids={IDS} deliveries={} processed={processed} duplicates={duplicates} effects={total} inbox_rows={claimed} in {:.2?}",
                stringify!($inbox),
                TASKS * IDS,
                elapsed
            );
            assert_eq!(processed, IDS);
            assert_eq!(processed + duplicates, TASKS * IDS);
            assert_eq!((total, distinct, claimed), (IDS as i64, IDS as i64, IDS as i64));
        }

        /// Drops the handler's future after each number of waits in turn, until
        /// it completes: every cancelled attempt must leave claim and effect
        /// together (both or neither), a directly held connection must refuse
        /// further transactions, and pooled connections must come back usable.
        #[tokio::test]
        async fn cancellation_at_every_await_point_leaves_nothing_half_done() {
            let Some((db, mut observer)) = fresh().await else { return };
            let pool = deadpool_pool(&db, 1);
            let mut cancelled_points = 0;
            for polls in 0.. {
                assert!(polls < 100, "the handler never completed");
                let id = format!("cancel-{polls}");
                let msg = Msg::new(id.clone());

                // A connection held directly.
                let mut direct = connect(&db).await;
                let attempt = CancelAfter::new(record(&mut direct, &msg), polls).await;
                let finished = attempt.is_some();
                if finished {
                    assert_eq!(attempt.unwrap().unwrap(), Outcome::Processed(0));
                } else {
                    cancelled_points += 1;
                    match record(&mut direct, &Msg::new("after-cancel")).await {
                        Err(AppError::Db(diesel::result::Error::BrokenTransactionManager)) => {}
                        other => panic!("a cancelled connection must refuse new work, got {other:?}"),
                    }
                }
                drop(direct);
                let direct_effects = effects(&mut observer, &id).await;
                let direct_claims = claims(&mut observer, "async.record", &id).await;
                assert_eq!(
                    direct_effects, direct_claims,
                    "claim and effect commit together (after {polls} waits)"
                );

                // A pooled connection (pool of one, so the next checkout is it).
                let pooled_id = format!("cancel-pooled-{polls}");
                let pooled_msg = Msg::new(pooled_id.clone());
                {
                    let mut object = pool.get().await.unwrap();
                    let _ = CancelAfter::new(record_deadpool(&mut object, &pooled_msg), polls).await;
                }
                let mut object = pool.get().await.expect("the pool hands out a usable connection");
                let redelivered = record_deadpool(&mut object, &pooled_msg).await.expect("the redelivery works");
                let (effect, claim) = (
                    effects(&mut observer, &pooled_id).await,
                    claims(&mut observer, "async.record", &pooled_id).await,
                );
                assert_eq!((effect, claim), (1, 1), "exactly once after a cancellation ({redelivered:?})");

                // The redelivery of the directly held message processes it once.
                let mut fresh_conn = connect(&db).await;
                let expected = if direct_effects == 1 { Outcome::Duplicate } else { Outcome::Processed(0) };
                assert_eq!(record(&mut fresh_conn, &msg).await.unwrap(), expected);
                assert_eq!(effects(&mut observer, &id).await, 1);
                if finished {
                    break;
                }
            }
            assert!(cancelled_points >= 3, "only {cancelled_points} await points were exercised");
            println!("async cancellation {}: cancelled at {cancelled_points} await points", stringify!($inbox));
        }
    };
}
