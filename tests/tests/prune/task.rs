//! The background pruner as a tokio task over diesel-async pools (deadpool
//! and bb8), on PostgreSQL and MariaDB: it prunes on its interval, reports
//! every run, stops on its handle (waiting for the run in flight) or when
//! the handle is dropped, and keeps going when the pool's connections are
//! killed or the server goes away; persistent failures back off.

#![cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]

use std::time::{Duration, Instant};

use inbox_runtime::Prune;
use inbox_runtime::prune::{BackgroundPruner, PrunerRun};
use tokio::sync::mpsc::{self, UnboundedReceiver};

use crate::background::Seen;
use crate::support::*;
use inbox_tests::proxy::Proxy;

/// How long a test waits for something that should happen in well under a
/// second, before failing rather than hanging.
const LIVENESS: Duration = Duration::from_secs(60);

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
pub async fn prunes_on_its_interval<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("old", 120), Some(30 * DAY));
    seed::<B>(&mut conn, "h", &ids("new", 5), None);
    let (on_run, mut runs) = reporter();
    let prune = Prune::new(policy(7 * DAY, DAY)).batch_size(50);
    let task = BackgroundPruner::new(prune)
        .every(Duration::from_millis(100))
        .spawn_task(B::deadpool(db.url(), 2), on_run);

    let first = next(&mut runs).await;
    assert_eq!((first.run, first.outcome.unwrap()), (1, (120, true)));
    assert_eq!(first.next_run_in, Duration::from_millis(100));

    seed::<B>(&mut conn, "h", &ids("older", 30), Some(30 * DAY));
    let mut deleted = 0;
    until(&mut runs, |run| {
        deleted += run.outcome.as_ref().map_or(0, |(rows, _)| *rows);
        deleted == 30
    })
    .await;

    assert!(!task.is_finished());
    task.stop().await.expect("the task ends cleanly");
    closed(&mut runs).await;
    assert_eq!(stored_ids(&mut conn, "h"), set(&ids("new", 5)));
}

/// Over bb8: `run_now` starts a run at once, and dropping the handle stops
/// the task.
pub async fn runs_now_and_stops_when_dropped<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("old", 40), Some(30 * DAY));
    let (on_run, mut runs) = reporter();
    let task = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_secs(3_600))
        .spawn_task(B::bb8(db.url(), 2).await, on_run);
    let first = next(&mut runs).await;
    assert_eq!((first.run, first.outcome.unwrap()), (1, (40, true)));

    // The next run is an hour away.
    seed::<B>(&mut conn, "h", &ids("older", 30), Some(30 * DAY));
    task.run_now();
    let second = next(&mut runs).await;
    assert_eq!((second.run, second.outcome.unwrap()), (2, (30, true)));

    drop(task);
    assert!(closed(&mut runs).await.is_empty(), "no run after the drop");
    assert_eq!(count(&mut conn), 0);
}

/// A long run (100 batches, 50 ms pauses): `stop` cuts it short between
/// batches and returns only once the run is over and reported, with every
/// batch it reports committed.
pub async fn stop_waits_for_the_run_in_flight<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("old", 1_000), Some(30 * DAY));
    let (on_run, mut runs) = reporter();
    let prune = Prune::new(policy(7 * DAY, DAY))
        .batch_size(10)
        .pause(Duration::from_millis(50));
    let task = BackgroundPruner::new(prune).spawn_task(B::deadpool(db.url(), 1), on_run);
    let deadline = Instant::now() + LIVENESS;
    while count(&mut conn) == 1_000 {
        assert!(Instant::now() < deadline, "the pruner never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.stop().await.expect("the task ends cleanly");
    // Reported before `stop` returned.
    let run = runs.try_recv().expect("the run in flight was reported");
    let (rows, caught_up) = run.outcome.unwrap();
    assert!(!caught_up, "the run was cut short");
    assert!(rows > 0 && rows < 1_000, "{rows}");
    assert_eq!(count(&mut conn), 1_000 - rows as i64);
    assert!(closed(&mut runs).await.is_empty(), "no run after stop");
}

/// The server kills the pool's connections (a failover, an admin's
/// `pg_terminate_backend` or `KILL`): the task keeps pruning.
pub async fn survives_killed_connections<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    let tag = inbox_tests::unique_name("pruner_task");
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("before", 40), Some(30 * DAY));
    let (on_run, mut runs) = reporter();
    let task = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_millis(100))
        .spawn_task(B::deadpool(&db.tagged_url(&tag), 2), on_run);
    until(&mut runs, |run| matches!(run.outcome, Ok((40, true)))).await;

    for round in 0..3 {
        assert!(
            kill_tagged(&db, &mut conn, &tag) > 0,
            "the pool had connections to kill"
        );
        seed::<B>(
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
    assert_eq!(count(&mut conn), 0);
    assert!(!task.is_finished());
    task.stop().await.expect("the task never panics");
}

/// The server goes away (every connection cut, new ones refused) and comes
/// back: failed runs are reported and retried, then the task catches up.
pub async fn survives_a_restart<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    let (template, upstream) = Proxy::split_url(&B::async_tcp_url(db.url()), B::DEFAULT_PORT);
    let proxy = Proxy::start(&upstream);
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("before", 100), Some(30 * DAY));
    let (on_run, mut runs) = reporter();
    let task = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_millis(100))
        .checkout_timeout(Duration::from_millis(500))
        .spawn_task(B::deadpool(&proxy.url(&template), 2), on_run);
    until(&mut runs, |run| matches!(run.outcome, Ok((100, true)))).await;

    proxy.down();
    until(&mut runs, |run| run.outcome.is_err()).await;
    let failure = until(&mut runs, |run| run.outcome.is_err()).await;
    assert!(
        failure.iter().all(|run| run.outcome.is_err()),
        "{failure:#?}"
    );
    seed::<B>(&mut conn, "h", &ids("during", 50), Some(30 * DAY));

    proxy.up();
    let mut deleted = 0;
    until(&mut runs, |run| {
        deleted += run.outcome.as_ref().map_or(0, |(rows, _)| *rows);
        deleted == 50
    })
    .await;
    assert_eq!(count(&mut conn), 0);
    task.stop().await.expect("the task never panics");
}

/// Every run fails at once (no inbox table) with an interval of zero: the
/// task backs off instead of spinning.
pub async fn persistent_failures_back_off<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    use diesel::connection::SimpleConnection;
    db.connect()
        .batch_execute("DROP TABLE inbox_messages")
        .unwrap();
    let (on_run, mut runs) = reporter();
    let task = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::ZERO)
        .spawn_task(B::deadpool(db.url(), 1), on_run);
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
pub async fn a_panicking_callback_does_not_stop_it<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    let (tx, mut runs) = mpsc::unbounded_channel();
    let task = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_millis(20))
        .spawn_task(B::deadpool(db.url(), 1), move |run: &PrunerRun| {
            let _ = tx.send(run.run);
            if run.run == 1 {
                panic!("a bug in the report callback (expected by this test)");
            }
        });
    let first = tokio::time::timeout(LIVENESS, runs.recv()).await.unwrap();
    assert_eq!(first, Some(1));
    let second = tokio::time::timeout(LIVENESS, runs.recv()).await.unwrap();
    assert_eq!(second, Some(2), "still running");
    task.stop().await.unwrap();
}

inbox_tests::backend_tests!(
    async(multi_thread = 2) only [postgres, mysql]:
    prunes_on_its_interval,
    runs_now_and_stops_when_dropped,
    stop_waits_for_the_run_in_flight,
    survives_killed_connections,
    survives_a_restart,
    persistent_failures_back_off,
    a_panicking_callback_does_not_stop_it,
);
