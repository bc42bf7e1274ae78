//! The background pruner: runs, reports, stops on its handle, and survives
//! the database going away.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use inbox_runtime::Prune;
use inbox_runtime::prune::{BackgroundPruner, PrunerRun};

use crate::support::*;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use inbox_tests::proxy::Proxy;

/// How long a test waits for something that should happen in well under a
/// second, before failing rather than hanging.
const LIVENESS: Duration = Duration::from_secs(60);

/// What the tests need from a [`PrunerRun`], sent over a channel (also by
/// the `task` tests).
#[derive(Debug)]
pub(crate) struct Seen {
    pub(crate) run: u64,
    /// Rows deleted and caught up, or the error.
    pub(crate) outcome: Result<(u64, bool), String>,
    /// Read by the `task` tests.
    #[cfg_attr(
        not(all(feature = "async", any(feature = "postgres", feature = "mysql"))),
        allow(dead_code)
    )]
    pub(crate) next_run_in: Duration,
}

impl From<&PrunerRun> for Seen {
    fn from(run: &PrunerRun) -> Self {
        Seen {
            run: run.run,
            outcome: match &run.outcome {
                Ok(report) => Ok((report.rows_deleted, report.caught_up)),
                Err(error) => Err(error.to_string()),
            },
            next_run_in: run.next_run_in,
        }
    }
}

fn reporter() -> (impl FnMut(&PrunerRun) + Send + 'static, Receiver<Seen>) {
    let (tx, rx) = mpsc::channel();
    let on_run = move |run: &PrunerRun| {
        let _ = tx.send(Seen::from(run));
    };
    (on_run, rx)
}

fn next(runs: &Receiver<Seen>) -> Seen {
    runs.recv_timeout(LIVENESS)
        .expect("the pruner reports every run")
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// Waits for the first run matching `wanted`, returning the runs seen
/// before it.
fn until(runs: &Receiver<Seen>, mut wanted: impl FnMut(&Seen) -> bool) -> Vec<Seen> {
    let deadline = Instant::now() + LIVENESS;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match runs.recv_timeout(left) {
            Ok(run) if wanted(&run) => return seen,
            Ok(run) => seen.push(run),
            Err(error) => panic!("no matching run ({error}); runs seen: {seen:#?}"),
        }
    }
}

pub fn stops_on_its_handle<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("old", 120), Some(30 * DAY));
    let (on_run, runs) = reporter();
    let handle = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)).batch_size(50))
        .every(Duration::from_secs(3_600))
        .spawn(db.pool(2), on_run)
        .unwrap();

    let first = next(&runs);
    assert_eq!((first.run, first.outcome.unwrap()), (1, (120, true)));

    // The next run is an hour away; `run_now` starts it at once.
    seed::<B>(&mut conn, "h", &ids("older", 30), Some(30 * DAY));
    handle.run_now();
    let second = next(&runs);
    assert_eq!((second.run, second.outcome.unwrap()), (2, (30, true)));

    // Stopping wakes the sleeping thread and joins it: the callback (and
    // with it the channel's sender) is gone afterwards.
    assert!(!handle.is_finished());
    handle.stop().expect("the pruner thread does not panic");
    assert_eq!(
        runs.recv_timeout(LIVENESS).unwrap_err(),
        RecvTimeoutError::Disconnected
    );
    assert_eq!(count(&mut conn), 0);
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub fn stop_interrupts_a_long_run<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("old", 1_000), Some(30 * DAY));
    let (on_run, runs) = reporter();
    // 100 batches with 50 ms pauses: a five-second run.
    let prune = Prune::new(policy(7 * DAY, DAY))
        .batch_size(10)
        .pause(Duration::from_millis(50));
    let handle = BackgroundPruner::new(prune)
        .spawn(db.pool(1), on_run)
        .unwrap();
    let deadline = Instant::now() + LIVENESS;
    while count(&mut conn) == 1_000 {
        assert!(Instant::now() < deadline, "the pruner never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Dropping the handle stops the pruner too (and waits for it).
    drop(handle);
    let run = next(&runs);
    let (rows, caught_up) = run.outcome.unwrap();
    assert!(!caught_up, "the run was cut short");
    assert!(rows > 0 && rows < 1_000, "{rows}");
    assert_eq!(count(&mut conn), 1_000 - rows as i64);
    assert!(runs.recv_timeout(LIVENESS).is_err(), "no run after stop");
}

pub fn a_panicking_callback_does_not_stop_it<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let (tx, runs) = mpsc::channel();
    let handle = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_millis(20))
        .spawn(db.pool(1), move |run: &PrunerRun| {
            let _ = tx.send(run.run);
            if run.run == 1 {
                panic!("a bug in the report callback (expected by this test)");
            }
        })
        .unwrap();
    assert_eq!(runs.recv_timeout(LIVENESS).unwrap(), 1);
    assert_eq!(
        runs.recv_timeout(LIVENESS).unwrap(),
        2,
        "still running after the panic"
    );
    handle.stop().unwrap();
}

/// The server goes away (every connection cut, new ones refused) and comes
/// back: failed runs are reported and retried, then the pruner catches up.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub fn survives_a_restart<B: ServerBackend>() {
    use diesel::r2d2::ConnectionManager;

    let Some(db) = B::open() else { return };
    let (template, upstream) = Proxy::split_url(db.url(), B::DEFAULT_PORT);
    let proxy = Proxy::start(&upstream);
    let pool = B::pool_builder()
        .max_size(2)
        .build(ConnectionManager::<B::Connection>::new(
            proxy.url(&template),
        ))
        .expect("a pool through the proxy");
    let mut conn = db.connect(); // direct, not through the proxy
    seed::<B>(&mut conn, "h", &ids("before", 100), Some(30 * DAY));

    let (on_run, runs) = reporter();
    let handle = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_millis(100))
        .checkout_timeout(Duration::from_millis(500))
        .spawn(pool, on_run)
        .unwrap();
    until(&runs, |run| matches!(run.outcome, Ok((100, true))));

    // The "restart": every connection cut, new ones refused.
    proxy.down();
    until(&runs, |run| run.outcome.is_err());
    let failure = until(&runs, |run| run.outcome.is_err());
    assert!(
        failure.iter().all(|run| run.outcome.is_err()),
        "{failure:#?}"
    );
    seed::<B>(&mut conn, "h", &ids("during", 50), Some(30 * DAY));

    // Back up: the next runs succeed and catch up.
    proxy.up();
    let mut deleted = 0;
    until(&runs, |run| {
        if let Ok((rows, _)) = run.outcome {
            deleted += rows;
        }
        deleted == 50
    });
    assert_eq!(count(&mut conn), 0);
    assert!(!handle.is_finished());
    handle.stop().expect("the pruner never panics");
}

/// An interval "forever" (`Duration::MAX`): the thread waits for `run_now`
/// instead of dying of an overflowing deadline after its first run.
pub fn an_endless_interval_runs_on_request<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let (on_run, runs) = reporter();
    let handle = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::MAX)
        .spawn(db.pool(1), on_run)
        .unwrap();
    assert_eq!(next(&runs).run, 1);
    handle.run_now();
    assert_eq!(next(&runs).run, 2, "the thread outlived its first wait");
    assert!(!handle.is_finished());
    handle.stop().expect("the pruner thread does not panic");
}

inbox_tests::backend_tests! {
    stops_on_its_handle, a_panicking_callback_does_not_stop_it, an_endless_interval_runs_on_request;
    only [postgres, sqlite]: stop_interrupts_a_long_run;
    only [postgres, mysql]: survives_a_restart;
    only [sqlite]: persistent_failures_back_off;
    only [postgres]: survives_killed_backends;
}

/// A database that fails every run at once (here: no inbox table) with an
/// interval of zero: the pruner backs off instead of spinning, and a
/// success brings the interval back.
#[cfg(feature = "sqlite")]
pub fn persistent_failures_back_off<B: TestBackend>() {
    use diesel::connection::SimpleConnection;

    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    conn.batch_execute("DROP TABLE inbox_messages").unwrap();
    let (tx, runs) = mpsc::channel();
    let handle = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::ZERO)
        .spawn(db.pool(1), move |run: &PrunerRun| {
            let _ = tx.send((run.is_ok(), run.next_run_in, run.to_string()));
        })
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let failed: Vec<_> = runs.try_iter().collect();
    // 100 + 200 + 400 ms of backoff: 4 runs in the second (fewer on a slow
    // machine); without the backoff, thousands.
    assert!(
        (2..=10).contains(&failed.len()),
        "{} failed runs in a second",
        failed.len()
    );
    let ms = Duration::from_millis;
    let waits: Vec<Duration> = failed.iter().map(|(_, wait, _)| *wait).collect();
    assert_eq!(waits[..2], [ms(100), ms(200)]);
    assert!(failed.iter().all(|(ok, _, _)| !ok));
    assert!(
        failed[1]
            .2
            .starts_with("prune run 2 failed (retrying in 200ms): "),
        "{}",
        failed[1].2
    );

    // The table is back: the next run succeeds and the interval applies.
    inbox_runtime::setup(&mut conn).unwrap();
    handle.run_now();
    let deadline = Instant::now() + LIVENESS;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (ok, wait, text) = runs.recv_timeout(left).expect("a successful run");
        if ok {
            assert_eq!(wait, Duration::ZERO, "{text}");
            break;
        }
    }
    handle.stop().unwrap();
}

/// The server kills the pool's connections (as on a failover or an admin's
/// `pg_terminate_backend`): the pruner keeps working.
#[cfg(feature = "postgres")]
pub fn survives_killed_backends<B: ServerBackend>() {
    if B::skipped_without_sessions("it kills the pool's server sessions by id") {
        return;
    }
    use diesel::r2d2::{ConnectionManager, Pool};

    let Some(db) = B::open() else { return };
    let application = inbox_tests::unique_name("pruner");
    let pool = Pool::builder()
        .max_size(2)
        .build(ConnectionManager::<B::Connection>::new(
            db.tagged_url(&application),
        ))
        .unwrap();
    let mut conn = db.connect();
    seed::<B>(&mut conn, "h", &ids("before", 40), Some(30 * DAY));
    let (on_run, runs) = reporter();
    let handle = BackgroundPruner::new(Prune::new(policy(7 * DAY, DAY)))
        .every(Duration::from_millis(100))
        .spawn(pool, on_run)
        .unwrap();
    until(&runs, |run| matches!(run.outcome, Ok((40, true))));

    for _ in 0..3 {
        let killed = kill_tagged(&db, &mut conn, &application);
        assert!(killed > 0, "the pool had connections to kill");
        seed::<B>(
            &mut conn,
            "h",
            &ids(&inbox_tests::unique_name("after"), 20),
            Some(30 * DAY),
        );
        let mut deleted = 0;
        until(&runs, |run| {
            if let Ok((rows, _)) = run.outcome {
                deleted += rows;
            }
            deleted == 20
        });
    }
    assert_eq!(count(&mut conn), 0);
    handle.stop().unwrap();
}
