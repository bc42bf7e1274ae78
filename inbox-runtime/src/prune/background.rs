//! A thread that prunes on an interval over an r2d2 pool.

use std::any::Any;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use diesel::connection::Connection;
use diesel::r2d2::{ManageConnection, Pool, PoolError};

use super::{Prune, PruneError, PruneReport};
use crate::backend::InboxBackend;

/// Work a [`BackgroundPruner`] runs on every tick: [`Prune`] (batched
/// deletes) or, on PostgreSQL, `partitioned::Maintenance`.
///
/// `should_stop` turns `true` when the pruner's handle asks it to stop; a
/// long job checks it between batches and returns early.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{Prune, RetentionPolicy, prune::PruneJob};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let mut job = Prune::new(RetentionPolicy::parse("7d", "1d")?);
/// let report = PruneJob::<SqliteConnection>::run_job(&mut job, &mut conn, &|| false)?;
/// assert!(report.caught_up);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait PruneJob<C>: Send + 'static {
    /// Runs the job once on `conn`.
    fn run_job(
        &mut self,
        conn: &mut C,
        should_stop: &dyn Fn() -> bool,
    ) -> Result<PruneReport, PruneError>;
}

impl<C> PruneJob<C> for Prune
where
    C: Connection,
    C::Backend: InboxBackend,
{
    fn run_job(
        &mut self,
        conn: &mut C,
        should_stop: &dyn Fn() -> bool,
    ) -> Result<PruneReport, PruneError> {
        self.run_with_progress(conn, |_| {
            if should_stop() {
                std::ops::ControlFlow::Break(())
            } else {
                std::ops::ControlFlow::Continue(())
            }
        })
    }
}

/// Why a background run failed.
///
/// ```
/// use inbox_runtime::prune::PruneRunError;
/// let err = PruneRunError::Panicked("boom".into());
/// assert_eq!(err.to_string(), "the pruning job panicked: boom");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum PruneRunError {
    /// No connection could be checked out of the pool in time (the database
    /// is down or restarting, or the pool is exhausted).
    Checkout(PoolError),
    /// The job failed on the database; batches committed before the failure
    /// are in its report.
    Prune(PruneError),
    /// The job panicked. The pruner caught it and keeps running.
    Panicked(String),
}

impl fmt::Display for PruneRunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PruneRunError::Checkout(error) => write!(f, "no database connection: {error}"),
            PruneRunError::Prune(error) => error.fmt(f),
            PruneRunError::Panicked(message) => write!(f, "the pruning job panicked: {message}"),
        }
    }
}

impl std::error::Error for PruneRunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PruneRunError::Checkout(error) => Some(error),
            PruneRunError::Prune(error) => Some(error),
            PruneRunError::Panicked(_) => None,
        }
    }
}

/// One run of a [`BackgroundPruner`], as passed to its report callback.
///
/// ```no_run
/// # #[cfg(feature = "postgres")] {
/// use std::sync::mpsc;
/// use diesel::r2d2::{ConnectionManager, Pool};
/// use inbox_runtime::{Prune, RetentionPolicy, prune::{BackgroundPruner, PruneRun}};
///
/// let pool = Pool::new(ConnectionManager::<diesel::PgConnection>::new("postgres://localhost/app"))?;
/// let (runs, received) = mpsc::channel::<String>();
/// let handle = BackgroundPruner::new(Prune::new(RetentionPolicy::parse("7d", "2d")?))
///     .spawn(pool, move |run: &PruneRun| {
///         let _ = runs.send(run.to_string());
///     })?;
/// println!("{}", received.recv()?); // "prune run 1: deleted 12000 rows in 3 batches in 48.0 ms (caught up)"
/// handle.stop();
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct PruneRun {
    /// The run's number, from 1.
    pub run: u64,
    /// When it started (wall clock, for logs).
    pub started_at: SystemTime,
    /// How long it took, checkout included.
    pub elapsed: Duration,
    /// What it did, or why it failed. A failed run is retried at the next
    /// interval.
    pub outcome: Result<PruneReport, PruneRunError>,
}

impl PruneRun {
    /// `true` when the run succeeded.
    ///
    /// ```
    /// # fn check(run: &inbox_runtime::prune::PruneRun) {
    /// if !run.is_ok() { eprintln!("{run}"); }
    /// # }
    /// ```
    pub fn is_ok(&self) -> bool {
        self.outcome.is_ok()
    }
}

impl fmt::Display for PruneRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Ok(report) => write!(f, "prune run {}: {report}", self.run),
            Err(error) => write!(
                f,
                "prune run {} failed (retrying at the next interval): {error}",
                self.run
            ),
        }
    }
}

/// Configures a pruning thread: a [`PruneJob`] run every interval over a
/// connection pool, each run reported to a callback.
///
/// - The first run starts right away, then one every [`every`](Self::every)
///   after the previous run ended.
/// - A failure (no connection, the database restarting, a lost connection)
///   is reported and retried at the next interval; a panic in the job or in
///   the callback is caught. The thread never dies of either.
/// - [`PrunerHandle::stop`] (or dropping the handle) ends it: a run in
///   progress stops after its current batch.
///
/// ```no_run
/// # #[cfg(feature = "postgres")] {
/// use std::time::Duration;
/// use diesel::r2d2::{ConnectionManager, Pool};
/// use inbox_runtime::{Prune, RetentionPolicy, prune::BackgroundPruner};
///
/// let pool = Pool::new(ConnectionManager::<diesel::PgConnection>::new("postgres://localhost/app"))?;
/// let prune = Prune::new(RetentionPolicy::parse("7d", "2d")?).batch_size(5_000)?;
/// let pruner = BackgroundPruner::new(prune)
///     .every(Duration::from_secs(60))
///     .spawn(pool, |run| {
///         if !run.is_ok() {
///             eprintln!("{run}");
///         }
///     })?;
/// // ... serve messages ...
/// pruner.stop(); // also done when `pruner` is dropped
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct BackgroundPruner<J> {
    job: J,
    every: Duration,
    checkout_timeout: Duration,
    thread_name: String,
}

impl<J> BackgroundPruner<J> {
    /// A pruner running `job` every minute.
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy, prune::BackgroundPruner};
    /// let pruner = BackgroundPruner::new(Prune::new(RetentionPolicy::parse("7d", "1d")?));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn new(job: J) -> Self {
        BackgroundPruner {
            job,
            every: Duration::from_secs(60),
            checkout_timeout: Duration::from_secs(5),
            thread_name: "inbox-pruner".to_owned(),
        }
    }

    /// The pause between the end of one run and the start of the next.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use inbox_runtime::{Prune, RetentionPolicy, prune::BackgroundPruner};
    /// let pruner = BackgroundPruner::new(Prune::new(RetentionPolicy::parse("7d", "1d")?))
    ///     .every(Duration::from_secs(300));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn every(mut self, interval: Duration) -> Self {
        self.every = interval;
        self
    }

    /// How long a run waits for a pooled connection before it is reported
    /// as failed (default 5 s). Stopping waits for at most this long.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use inbox_runtime::{Prune, RetentionPolicy, prune::BackgroundPruner};
    /// let pruner = BackgroundPruner::new(Prune::new(RetentionPolicy::parse("7d", "1d")?))
    ///     .checkout_timeout(Duration::from_secs(2));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn checkout_timeout(mut self, timeout: Duration) -> Self {
        self.checkout_timeout = timeout;
        self
    }

    /// The thread's name (default `inbox-pruner`).
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy, prune::BackgroundPruner};
    /// let pruner = BackgroundPruner::new(Prune::new(RetentionPolicy::parse("7d", "1d")?))
    ///     .thread_name("billing-inbox-pruner");
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.thread_name = name.into();
        self
    }

    /// Starts the thread. `on_run` receives every run's [`PruneRun`]; with
    /// the `log` feature, runs are also logged (info, or warn on failure).
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")] {
    /// # use diesel::r2d2::{ConnectionManager, Pool};
    /// # use inbox_runtime::{Prune, RetentionPolicy, prune::BackgroundPruner};
    /// let pool = Pool::new(ConnectionManager::<diesel::PgConnection>::new("postgres://localhost/app"))?;
    /// let handle = BackgroundPruner::new(Prune::new(RetentionPolicy::parse("7d", "1d")?))
    ///     .spawn(pool, |run| println!("{run}"))?;
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spawn<M, F>(self, pool: Pool<M>, on_run: F) -> std::io::Result<PrunerHandle>
    where
        M: ManageConnection,
        J: PruneJob<M::Connection>,
        F: FnMut(&PruneRun) + Send + 'static,
    {
        let shared = Arc::new(Shared::default());
        let worker = Worker {
            job: self.job,
            every: self.every,
            checkout_timeout: self.checkout_timeout,
            pool,
            on_run,
            shared: Arc::clone(&shared),
        };
        let thread = thread::Builder::new()
            .name(self.thread_name)
            .spawn(move || worker.run())?;
        Ok(PrunerHandle {
            shared,
            thread: Some(thread),
        })
    }
}

/// Controls a running [`BackgroundPruner`]. Dropping it stops the thread and
/// waits for it.
///
/// ```no_run
/// # #[cfg(feature = "postgres")] {
/// # use diesel::r2d2::{ConnectionManager, Pool};
/// # use inbox_runtime::{Prune, RetentionPolicy, prune::BackgroundPruner};
/// # let pool = Pool::new(ConnectionManager::<diesel::PgConnection>::new("postgres://localhost/app"))?;
/// let handle = BackgroundPruner::new(Prune::new(RetentionPolicy::parse("7d", "1d")?)).spawn(pool, |_| {})?;
/// handle.run_now(); // don't wait for the interval
/// assert!(handle.stop().is_ok());
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PrunerHandle {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl PrunerHandle {
    /// Starts the next run now instead of at the end of the interval (if a
    /// run is in progress, another follows it right away).
    ///
    /// ```no_run
    /// # fn f(handle: &inbox_runtime::prune::PrunerHandle) {
    /// handle.run_now();
    /// # }
    /// ```
    pub fn run_now(&self) {
        self.shared.lock().run_now = true;
        self.shared.wake.notify_all();
    }

    /// Stops the thread and waits for it: a run in progress ends after its
    /// current batch (or its connection checkout). `Err` only if the thread
    /// itself panicked, which the pruner is built not to do.
    ///
    /// ```no_run
    /// # fn f(handle: inbox_runtime::prune::PrunerHandle) {
    /// handle.stop().expect("the pruner thread never panics");
    /// # }
    /// ```
    pub fn stop(mut self) -> thread::Result<()> {
        self.signal_stop();
        match self.thread.take() {
            Some(thread) => thread.join(),
            None => Ok(()),
        }
    }

    /// `true` once the thread has ended.
    ///
    /// ```no_run
    /// # fn f(handle: &inbox_runtime::prune::PrunerHandle) {
    /// assert!(!handle.is_finished());
    /// # }
    /// ```
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    fn signal_stop(&self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
    }
}

impl Drop for PrunerHandle {
    fn drop(&mut self) {
        self.signal_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct State {
    stop: bool,
    run_now: bool,
}

impl Shared {
    /// The state, even if a thread panicked while holding the lock (the
    /// flags stay meaningful).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stop_requested(&self) -> bool {
        self.lock().stop
    }
}

struct Worker<J, M: ManageConnection, F> {
    job: J,
    every: Duration,
    checkout_timeout: Duration,
    pool: Pool<M>,
    on_run: F,
    shared: Arc<Shared>,
}

impl<J, M, F> Worker<J, M, F>
where
    M: ManageConnection,
    J: PruneJob<M::Connection>,
    F: FnMut(&PruneRun),
{
    fn run(mut self) {
        let mut run = 0;
        while !self.shared.stop_requested() {
            run += 1;
            let started_at = SystemTime::now();
            let started = Instant::now();
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| self.run_once()))
                .unwrap_or_else(|panic| Err(PruneRunError::Panicked(panic_message(&*panic))));
            let report = PruneRun {
                run,
                started_at,
                elapsed: started.elapsed(),
                outcome,
            };
            #[cfg(feature = "log")]
            match &report.outcome {
                Ok(_) => log::info!(target: "inbox_runtime::prune", "{report}"),
                Err(_) => log::warn!(target: "inbox_runtime::prune", "{report}"),
            }
            let on_run = &mut self.on_run;
            // A panicking callback must not take the pruner down with it.
            let _ = panic::catch_unwind(AssertUnwindSafe(|| on_run(&report)));
            if !self.wait_for_next_run() {
                break;
            }
        }
    }

    fn run_once(&mut self) -> Result<PruneReport, PruneRunError> {
        let mut conn = self
            .pool
            .get_timeout(self.checkout_timeout)
            .map_err(PruneRunError::Checkout)?;
        let shared = &self.shared;
        self.job
            .run_job(&mut conn, &|| shared.stop_requested())
            .map_err(PruneRunError::Prune)
    }

    /// Sleeps until the interval is over (`true`), or stop is requested
    /// (`false`); `run_now` cuts the sleep short.
    fn wait_for_next_run(&self) -> bool {
        let deadline = Instant::now() + self.every;
        let mut state = self.shared.lock();
        loop {
            if state.stop {
                return false;
            }
            if state.run_now {
                state.run_now = false;
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            state = self
                .shared
                .wake
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}
