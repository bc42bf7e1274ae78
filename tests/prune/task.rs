//! The background pruner as a tokio task over diesel-async pools (deadpool
//! and bb8), on PostgreSQL and MariaDB: it prunes on its interval, reports
//! every run, stops on its handle (waiting for the run in flight) or when
//! the handle is dropped, and keeps going when the pool's connections are
//! killed or the server goes away; persistent failures back off.

#![cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]

use std::time::{Duration, Instant};

use diesel_async::pooled_connection::{bb8, deadpool, AsyncDieselConnectionManager};
use inbox_runtime::prune::{AsyncPrunePool, BackgroundPruner, PrunerRun};
use inbox_runtime::Prune;
use tokio::sync::mpsc::{self, UnboundedReceiver};

use crate::background::Seen;
use crate::common::*;
use crate::proxy::Proxy;

/// How long a test waits for something that should happen in well under a
/// second, before failing rather than hanging.
const LIVENESS: Duration = Duration::from_secs(60);

/// A server with diesel-async connections and pools of them.
trait AsyncServer: PruneDb {
    type Deadpool: AsyncPrunePool + Clone;
    type Bb8: AsyncPrunePool;
    const DEFAULT_PORT: u16;

    fn deadpool(url: &str, size: usize) -> Self::Deadpool;
    async fn bb8(url: &str, size: u32) -> Self::Bb8;

    /// The test database's URL, for diesel-async connections.
    fn url_for_async(&self) -> String;

    /// The same with `tag` on its connections, where the server can tell
    /// connections apart that way.
    fn tagged_url(&self, tag: &str) -> String;

    /// Kills the server-side connections opened with `tag` (PostgreSQL) or
    /// to this test's database (MariaDB), except `conn`'s own; returns how
    /// many.
    fn kill_connections(&self, conn: &mut Self::Connection, tag: &str) -> usize;
}

/// The pool types and builders of an `AsyncServer` whose connections are
/// `$conn`.
macro_rules! pools {
    ($conn:ty) => {
        type Deadpool = deadpool::Pool<$conn>;
        type Bb8 = bb8::Pool<$conn>;

        fn deadpool(url: &str, size: usize) -> Self::Deadpool {
            deadpool::Pool::builder(AsyncDieselConnectionManager::new(url))
                .max_size(size)
                .build()
                .expect("a deadpool pool")
        }

        async fn bb8(url: &str, size: u32) -> Self::Bb8 {
            bb8::Pool::builder()
                .max_size(size)
                .build(AsyncDieselConnectionManager::new(url))
                .await
                .expect("a bb8 pool")
        }
    };
}

#[cfg(feature = "postgres")]
impl AsyncServer for inbox_suite::testdb::PgDatabase {
    pools!(diesel_async::AsyncPgConnection);
    const DEFAULT_PORT: u16 = 5432;

    fn url_for_async(&self) -> String {
        self.url().to_owned()
    }

    fn tagged_url(&self, tag: &str) -> String {
        format!("{}&application_name={tag}", self.url())
    }

    fn kill_connections(&self, conn: &mut diesel::PgConnection, tag: &str) -> usize {
        use diesel::RunQueryDsl;
        diesel::sql_query(format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{tag}'"
        ))
        .execute(conn)
        .expect("kill the pool's connections")
    }
}

#[cfg(feature = "mysql")]
impl AsyncServer for inbox_suite::testdb::MysqlDatabase {
    pools!(diesel_async::AsyncMysqlConnection);
    const DEFAULT_PORT: u16 = 3306;

    /// mysql_async moves a connection to a loopback address onto the
    /// server's Unix socket unless told not to, which would bypass the
    /// proxy of `survives_a_restart`.
    fn url_for_async(&self) -> String {
        format!("{}?prefer_socket=false", self.url())
    }

    fn tagged_url(&self, _tag: &str) -> String {
        self.url_for_async()
    }

    fn kill_connections(&self, conn: &mut diesel::MysqlConnection, _tag: &str) -> usize {
        use diesel::connection::SimpleConnection;
        use diesel::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct Id {
            #[diesel(sql_type = diesel::sql_types::Unsigned<diesel::sql_types::BigInt>)]
            id: u64,
        }
        let database = self.url().rsplit('/').next().expect("a database name");
        let ids: Vec<Id> = diesel::sql_query(format!(
            "SELECT ID AS id FROM information_schema.PROCESSLIST \
             WHERE DB = '{database}' AND ID <> CONNECTION_ID()"
        ))
        .load(conn)
        .expect("list the pool's connections");
        for Id { id } in &ids {
            // Gone already is fine.
            let _ = conn.batch_execute(&format!("KILL CONNECTION {id}"));
        }
        ids.len()
    }
}

fn reporter() -> (
    impl FnMut(&PrunerRun) + Send + 'static,
    UnboundedReceiver<Seen>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let on_run = move |run: &PrunerRun| {
        let _ = tx.send(Seen::from(run));
    };
    (on_run, rx)
}

async fn next(runs: &mut UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(LIVENESS, runs.recv())
        .await
        .expect("the pruner reports every run")
        .expect("the pruner is running")
}

/// Waits for the first run matching `wanted`, returning the runs seen
/// before it.
async fn until(
    runs: &mut UnboundedReceiver<Seen>,
    mut wanted: impl FnMut(&Seen) -> bool,
) -> Vec<Seen> {
    let deadline = Instant::now() + LIVENESS;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, runs.recv()).await {
            Ok(Some(run)) if wanted(&run) => return seen,
            Ok(Some(run)) => seen.push(run),
            Ok(None) => panic!("the pruner stopped; runs seen: {seen:#?}"),
            Err(_) => panic!("no matching run; runs seen: {seen:#?}"),
        }
    }
}

/// Waits until the run reports have stopped: the task ended and dropped
/// its callback. Returns the runs reported meanwhile.
async fn closed(runs: &mut UnboundedReceiver<Seen>) -> Vec<Seen> {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(LIVENESS, runs.recv()).await {
            Ok(Some(run)) => seen.push(run),
            Ok(None) => return seen,
            Err(_) => panic!("the task never ended; runs seen: {seen:#?}"),
        }
    }
}

/// Expired rows go on every run of the interval, without `run_now`; fresh
/// ones stay. `stop` ends the task and returns once it has.
async fn prunes_on_its_interval<D: AsyncServer>(db: &D) {
    let mut conn = db.connect();
    seed::<D>(&mut conn, "h", &ids("old", 120), Some(30 * DAY));
    seed::<D>(&mut conn, "h", &ids("new", 5), None);
    let (on_run, mut runs) = reporter();
    let prune = Prune::new(policy(7 * DAY, DAY)).batch_size(50);
    let task = BackgroundPruner::new(prune)
        .every(Duration::from_millis(100))
        .spawn_task(D::deadpool(&db.url_for_async(), 2), on_run);

    let first = next(&mut runs).await;
    assert_eq!((first.run, first.outcome.unwrap()), (1, (120, true)));
    assert_eq!(first.next_run_in, Duration::from_millis(100));

    seed::<D>(&mut conn, "h", &ids("older", 30), Some(30 * DAY));
    let mut deleted = 0;
    until(&mut runs, |run| {
        deleted += run.outcome.as_ref().map_or(0, |(rows, _)| *rows);
        deleted == 30
    })
    .await;

    assert!(!task.is_finished());
    task.stop().await.expect("the task ends cleanly");
    closed(&mut runs).await;
    assert_eq!(D::stored_ids(&mut conn, "h"), set(&ids("new", 5)));
}

/// Over bb8: `run_now` starts a run at once, and dropping the handle stops
/// the task.
async fn runs_now_and_stops_when_dropped<D: AsyncServer>(db: &D) {
    let mut conn = db.connect();
    seed::<D>(&mut conn, "h", &ids("old", 40), Some(30 * DAY));
    let (on_run, mut runs) = reporter();
    let task = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_secs(3_600))
        .spawn_task(D::bb8(&db.url_for_async(), 2).await, on_run);
    let first = next(&mut runs).await;
    assert_eq!((first.run, first.outcome.unwrap()), (1, (40, true)));

    // The next run is an hour away.
    seed::<D>(&mut conn, "h", &ids("older", 30), Some(30 * DAY));
    task.run_now();
    let second = next(&mut runs).await;
    assert_eq!((second.run, second.outcome.unwrap()), (2, (30, true)));

    drop(task);
    assert!(closed(&mut runs).await.is_empty(), "no run after the drop");
    assert_eq!(D::count(&mut conn), 0);
}

/// A long run (100 batches, 50 ms pauses): `stop` cuts it short between
/// batches and returns only once the run is over and reported, with every
/// batch it reports committed.
async fn stop_waits_for_the_run_in_flight<D: AsyncServer>(db: &D) {
    let mut conn = db.connect();
    seed::<D>(&mut conn, "h", &ids("old", 1_000), Some(30 * DAY));
    let (on_run, mut runs) = reporter();
    let prune = Prune::new(policy(7 * DAY, DAY))
        .batch_size(10)
        .pause(Duration::from_millis(50));
    let task = BackgroundPruner::new(prune).spawn_task(D::deadpool(&db.url_for_async(), 1), on_run);
    let deadline = Instant::now() + LIVENESS;
    while D::count(&mut conn) == 1_000 {
        assert!(Instant::now() < deadline, "the pruner never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.stop().await.expect("the task ends cleanly");
    // Reported before `stop` returned.
    let run = runs.try_recv().expect("the run in flight was reported");
    let (rows, caught_up) = run.outcome.unwrap();
    assert!(!caught_up, "the run was cut short");
    assert!(rows > 0 && rows < 1_000, "{rows}");
    assert_eq!(D::count(&mut conn), 1_000 - rows as i64);
    assert!(closed(&mut runs).await.is_empty(), "no run after stop");
}

/// The server kills the pool's connections (a failover, an admin's
/// `pg_terminate_backend` or `KILL`): the task keeps pruning.
async fn survives_killed_connections<D: AsyncServer>(db: &D) {
    let tag = inbox_suite::testdb::unique_name("pruner_task");
    let mut conn = db.connect();
    seed::<D>(&mut conn, "h", &ids("before", 40), Some(30 * DAY));
    let (on_run, mut runs) = reporter();
    let task = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_millis(100))
        .spawn_task(D::deadpool(&db.tagged_url(&tag), 2), on_run);
    until(&mut runs, |run| matches!(run.outcome, Ok((40, true)))).await;

    for round in 0..3 {
        assert!(
            db.kill_connections(&mut conn, &tag) > 0,
            "the pool had connections to kill"
        );
        seed::<D>(
            &mut conn,
            "h",
            &ids(&format!("after{round}"), 20),
            Some(30 * DAY),
        );
        let mut deleted = 0;
        until(&mut runs, |run| {
            deleted += run.outcome.as_ref().map_or(0, |(rows, _)| *rows);
            deleted == 20
        })
        .await;
    }
    assert_eq!(D::count(&mut conn), 0);
    assert!(!task.is_finished());
    task.stop().await.expect("the task never panics");
}

/// The server goes away (every connection cut, new ones refused) and comes
/// back: failed runs are reported and retried, then the task catches up.
async fn survives_a_restart<D: AsyncServer>(db: &D) {
    let (template, upstream) = Proxy::split_url(&db.url_for_async(), D::DEFAULT_PORT);
    let proxy = Proxy::start(&upstream);
    let mut conn = db.connect();
    seed::<D>(&mut conn, "h", &ids("before", 100), Some(30 * DAY));
    let (on_run, mut runs) = reporter();
    let task = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_millis(100))
        .checkout_timeout(Duration::from_millis(500))
        .spawn_task(D::deadpool(&proxy.url(&template), 2), on_run);
    until(&mut runs, |run| matches!(run.outcome, Ok((100, true)))).await;

    proxy.down();
    until(&mut runs, |run| run.outcome.is_err()).await;
    let failure = until(&mut runs, |run| run.outcome.is_err()).await;
    assert!(
        failure.iter().all(|run| run.outcome.is_err()),
        "{failure:#?}"
    );
    seed::<D>(&mut conn, "h", &ids("during", 50), Some(30 * DAY));

    proxy.up();
    let mut deleted = 0;
    until(&mut runs, |run| {
        deleted += run.outcome.as_ref().map_or(0, |(rows, _)| *rows);
        deleted == 50
    })
    .await;
    assert_eq!(D::count(&mut conn), 0);
    task.stop().await.expect("the task never panics");
}

/// Every run fails at once (no inbox table) with an interval of zero: the
/// task backs off instead of spinning.
async fn persistent_failures_back_off<D: AsyncServer>(db: &D) {
    use diesel::connection::SimpleConnection;
    db.connect()
        .batch_execute("DROP TABLE inbox_messages")
        .unwrap();
    let (on_run, mut runs) = reporter();
    let task = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::ZERO)
        .spawn_task(D::deadpool(&db.url_for_async(), 1), on_run);
    tokio::time::sleep(Duration::from_secs(1)).await;
    task.stop().await.unwrap();
    let failed = closed(&mut runs).await;
    assert!(
        (2..=10).contains(&failed.len()),
        "{} failed runs in a second",
        failed.len()
    );
    assert!(failed.iter().all(|run| run.outcome.is_err()), "{failed:#?}");
    let ms = Duration::from_millis;
    assert_eq!(
        [failed[0].next_run_in, failed[1].next_run_in],
        [ms(100), ms(200)]
    );
}

/// A panic in the report callback is caught: the task keeps running.
async fn a_panicking_callback_does_not_stop_it<D: AsyncServer>(db: &D) {
    let (tx, mut runs) = mpsc::unbounded_channel();
    let task = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_millis(20))
        .spawn_task(
            D::deadpool(&db.url_for_async(), 1),
            move |run: &PrunerRun| {
                let _ = tx.send(run.run);
                if run.run == 1 {
                    panic!("a bug in the report callback (expected by this test)");
                }
            },
        );
    let first = tokio::time::timeout(LIVENESS, runs.recv()).await.unwrap();
    assert_eq!(first, Some(1));
    let second = tokio::time::timeout(LIVENESS, runs.recv()).await.unwrap();
    assert_eq!(second, Some(2), "still running");
    task.stop().await.unwrap();
}

/// Expands each generic test once per server, on a multi-thread runtime.
macro_rules! per_server {
    ($($test:ident),* $(,)?) => {
        #[cfg(feature = "postgres")]
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                use inbox_suite::testdb::TestDatabase as _;
                if let Some(db) = inbox_suite::testdb::PgDatabase::open() {
                    super::$test(&db).await;
                }
            })*
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                use inbox_suite::testdb::TestDatabase as _;
                if let Some(db) = inbox_suite::testdb::MysqlDatabase::open() {
                    super::$test(&db).await;
                }
            })*
        }
    };
}

per_server!(
    prunes_on_its_interval,
    runs_now_and_stops_when_dropped,
    stop_waits_for_the_run_in_flight,
    survives_killed_connections,
    survives_a_restart,
    persistent_failures_back_off,
    a_panicking_callback_does_not_stop_it,
);
