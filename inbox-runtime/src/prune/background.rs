//! Pruning on an interval in the background: a thread over an r2d2 pool
//! (feature `r2d2`, [`BackgroundPruner::spawn`]) or a tokio task over a
//! diesel-async pool (feature `tokio`, [`BackgroundPruner::spawn_task`]).
//! Both share the builder, the run reports, the stop and run-now signals,
//! and the backoff after failures; only the waiting and the connection
//! checkout differ.

use std::any::Any;
use std::fmt;
use std::ops::ControlFlow;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

#[cfg(feature = "r2d2")]
use std::sync::Arc;
#[cfg(feature = "r2d2")]
use std::thread::{self, JoinHandle};

#[cfg(feature = "r2d2")]
use diesel::connection::LoadConnection;
#[cfg(feature = "r2d2")]
use diesel::r2d2::{ManageConnection, Pool, PoolError};

#[cfg(feature = "r2d2")]
use super::Prune;
use super::{PruneError, PruneReport};
#[cfg(feature = "r2d2")]
use crate::backend::InboxBackend;
use crate::duration::format_duration;

/// The longest a background pruner backs off after failed runs in a row.
///
/// A failed run is retried at the next interval, but never sooner than a
/// backoff that starts at 100 ms and doubles with each failure in a row, up
/// to this: a pruner with a short (or zero) interval does not hammer a
/// database that keeps failing. A success resets it.
///
/// ```
/// assert_eq!(inbox_runtime::prune::MAX_RETRY_BACKOFF.as_secs(), 30);
/// ```
pub const MAX_RETRY_BACKOFF: Duration = crate::Backoff::DEFAULT.max;

/// The wait before the next run: the interval, or after `failures` failed
/// runs in a row at least the backoff.
fn next_wait(every: Duration, failures: u32) -> Duration {
    every.max(crate::Backoff::DEFAULT.after(failures))
}

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
#[cfg(feature = "r2d2")]
pub trait PruneJob<C>: Send + 'static {
    /// Runs the job once on `conn`.
    fn run_job(
        &mut self,
        conn: &mut C,
        should_stop: &dyn Fn() -> bool,
    ) -> Result<PruneReport, PruneError>;
}

#[cfg(feature = "r2d2")]
impl<C> PruneJob<C> for Prune
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    fn run_job(
        &mut self,
        conn: &mut C,
        should_stop: &dyn Fn() -> bool,
    ) -> Result<PruneReport, PruneError> {
        self.run_pausing(
            conn,
            |_| go_on(!should_stop()),
            |pause| pause_unless(pause, should_stop),
        )
    }
}

/// `Continue` if `go_on`, else `Break`.
pub(super) fn go_on(go_on: bool) -> ControlFlow<()> {
    if go_on {
        ControlFlow::Continue(())
    } else {
        ControlFlow::Break(())
    }
}

/// Sleeps `pause`, checking `should_stop` every few milliseconds: `Break`
/// as soon as it turns `true`.
#[cfg(feature = "r2d2")]
fn pause_unless(pause: Duration, should_stop: &dyn Fn() -> bool) -> ControlFlow<()> {
    const SLICE: Duration = Duration::from_millis(10);
    let deadline = Instant::now().checked_add(pause);
    loop {
        if should_stop() {
            return ControlFlow::Break(());
        }
        let left = deadline.map_or(SLICE, |deadline| {
            deadline.saturating_duration_since(Instant::now())
        });
        if left.is_zero() {
            return ControlFlow::Continue(());
        }
        thread::sleep(left.min(SLICE));
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
    #[cfg(feature = "r2d2")]
    Checkout(PoolError),
    /// No connection could be checked out of the async pool (deadpool or
    /// bb8) within the checkout timeout: the pool's error, or the timeout.
    #[cfg(feature = "tokio")]
    AsyncCheckout(Box<dyn std::error::Error + Send + Sync>),
    /// The job failed on the database; batches committed before the failure
    /// are in its report.
    Prune(PruneError),
    /// The job panicked. The pruner caught it and keeps running.
    Panicked(String),
}

impl fmt::Display for PruneRunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "r2d2")]
            PruneRunError::Checkout(error) => write!(f, "no database connection: {error}"),
            #[cfg(feature = "tokio")]
            PruneRunError::AsyncCheckout(error) => write!(f, "no database connection: {error}"),
            PruneRunError::Prune(error) => error.fmt(f),
            PruneRunError::Panicked(message) => write!(f, "the pruning job panicked: {message}"),
        }
    }
}

impl std::error::Error for PruneRunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            #[cfg(feature = "r2d2")]
            PruneRunError::Checkout(error) => Some(error),
            #[cfg(feature = "tokio")]
            PruneRunError::AsyncCheckout(error) => Some(&**error),
            PruneRunError::Prune(error) => Some(error),
            PruneRunError::Panicked(_) => None,
        }
    }
}

/// One run of a [`BackgroundPruner`] (thread or task), as passed to its
/// report callback.
///
/// ```no_run
/// # #[cfg(all(feature = "postgres", feature = "r2d2"))] {
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
    /// How long the pruner waits before its next run, unless stopped or
    /// woken by `run_now`: the interval, or after failed runs in a row at
    /// least a backoff (see [`MAX_RETRY_BACKOFF`]).
    pub next_run_in: Duration,
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
                "prune run {} failed (retrying in {}): {error}",
                self.run,
                format_duration(self.next_run_in)
            ),
        }
    }
}

/// Configures a background pruner: a job run every interval over a
/// connection pool, each run reported to a callback. [`spawn`](Self::spawn)
/// (feature `r2d2`) runs a [`PruneJob`] on a thread of its own;
/// [`spawn_task`](Self::spawn_task) (feature `tokio`) runs a [`Prune`](crate::Prune)
/// as a tokio task over a diesel-async pool.
///
/// - The first run starts right away, then one every [`every`](Self::every)
///   after the previous run ended.
/// - A failure (no connection, the database restarting, a lost connection)
///   is reported and retried at the next interval, backing off after
///   failures in a row when the interval is short (see
///   [`MAX_RETRY_BACKOFF`]); a panic in the job or in the callback is
///   caught. The pruner never dies of either.
/// - Stopping it through its handle (or dropping the handle) ends it: a run
///   in progress stops after its current batch, or during a pause between
///   batches.
///
/// ```no_run
/// # #[cfg(all(feature = "postgres", feature = "r2d2"))] {
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
    pub(super) job: J,
    pub(super) every: Duration,
    pub(super) checkout_timeout: Duration,
    #[cfg_attr(not(feature = "r2d2"), allow(dead_code))]
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

    /// The pause between the end of one run and the start of the next
    /// (default one minute). Zero runs back to back (failed runs still back
    /// off); `Duration::MAX` runs only when asked to (`run_now`).
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

    /// The thread's name (default `inbox-pruner`; a task has none).
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
    #[cfg(feature = "r2d2")]
    pub fn spawn<M, F>(self, pool: Pool<M>, on_run: F) -> std::io::Result<PrunerHandle>
    where
        M: ManageConnection,
        J: PruneJob<M::Connection>,
        F: FnMut(&PruneRun) + Send + 'static,
    {
        let signals = Arc::new(Signals::default());
        let worker = Worker {
            job: self.job,
            checkout_timeout: self.checkout_timeout,
            pool,
            book: RunBook::new(self.every, on_run),
            signals: Arc::clone(&signals),
        };
        let thread = thread::Builder::new()
            .name(self.thread_name)
            .spawn(move || worker.run())?;
        Ok(PrunerHandle {
            signals,
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
#[cfg(feature = "r2d2")]
#[derive(Debug)]
pub struct PrunerHandle {
    signals: Arc<Signals>,
    thread: Option<JoinHandle<()>>,
}

#[cfg(feature = "r2d2")]
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
        self.signals.request_run();
    }

    /// Stops the thread and waits for it: a run in progress ends after its
    /// current batch (or its connection checkout, or at once if it is
    /// pausing between batches). `Err` only if the thread
    /// itself panicked, which the pruner is built not to do.
    ///
    /// ```no_run
    /// # fn f(handle: inbox_runtime::prune::PrunerHandle) {
    /// handle.stop().expect("the pruner thread never panics");
    /// # }
    /// ```
    pub fn stop(mut self) -> thread::Result<()> {
        self.signals.request_stop();
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
}

#[cfg(feature = "r2d2")]
impl Drop for PrunerHandle {
    fn drop(&mut self) {
        self.signals.request_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A pruner's stop and run-now requests, and how its thread or task waits
/// for them.
#[derive(Debug, Default)]
pub(super) struct Signals {
    state: Mutex<State>,
    /// Wakes a waiting thread.
    wake: Condvar,
    /// Wakes a waiting task.
    #[cfg(feature = "tokio")]
    notify: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    stop: bool,
    run_now: bool,
}

impl Signals {
    pub(super) fn request_stop(&self) {
        self.lock().stop = true;
        self.wake_up();
    }

    pub(super) fn request_run(&self) {
        self.lock().run_now = true;
        self.wake_up();
    }

    pub(super) fn stop_requested(&self) -> bool {
        self.lock().stop
    }

    fn wake_up(&self) {
        self.wake.notify_all();
        // One waiter at most; a wake-up sent while it is not waiting is
        // kept for its next wait.
        #[cfg(feature = "tokio")]
        self.notify.notify_one();
    }

    /// The state, even if a thread panicked while holding the lock (the
    /// flags stay meaningful).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a wait ends now: `Some(false)` on a stop request,
    /// `Some(true)` on a run-now request (taken) when waiting `for_run`.
    fn settled(state: &mut State, for_run: bool) -> Option<bool> {
        if state.stop {
            Some(false)
        } else if for_run && state.run_now {
            state.run_now = false;
            Some(true)
        } else {
            None
        }
    }

    /// Blocks the thread for `delay` (forever for a `delay` past the end of
    /// time): `false` if a stop request ends the wait, `true` otherwise. A
    /// wait `for_run` (the next run) also ends on a run-now request; a pause
    /// between batches does not.
    #[cfg(feature = "r2d2")]
    pub(super) fn wait(&self, delay: Duration, for_run: bool) -> bool {
        let deadline = Instant::now().checked_add(delay);
        let mut state = self.lock();
        loop {
            if let Some(go_on) = Self::settled(&mut state, for_run) {
                return go_on;
            }
            state = match deadline {
                None => self
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return true;
                    }
                    let waited = self.wake.wait_timeout(state, deadline - now);
                    waited.unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
    }

    /// [`wait`](Self::wait) for a tokio task.
    #[cfg(feature = "tokio")]
    pub(super) async fn wait_async(&self, delay: Duration, for_run: bool) -> bool {
        let deadline = tokio::time::Instant::now().checked_add(delay);
        loop {
            if let Some(go_on) = Self::settled(&mut self.lock(), for_run) {
                return go_on;
            }
            let woken = self.notify.notified();
            match deadline {
                None => woken.await,
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, woken).await.is_err() {
                        return Self::settled(&mut self.lock(), for_run).unwrap_or(true);
                    }
                }
            }
        }
    }
}

/// A pruner's runs: numbering, timing, the report callback (and log), and
/// the wait before the next run.
pub(super) struct RunBook<F> {
    on_run: F,
    every: Duration,
    runs: u64,
    /// Failed runs in a row.
    failures: u32,
}

/// A run in progress.
pub(super) struct RunStart {
    run: u64,
    at: SystemTime,
    clock: Instant,
}

impl<F: FnMut(&PruneRun)> RunBook<F> {
    pub(super) fn new(every: Duration, on_run: F) -> Self {
        RunBook {
            on_run,
            every,
            runs: 0,
            failures: 0,
        }
    }

    pub(super) fn start(&mut self) -> RunStart {
        self.runs += 1;
        RunStart {
            run: self.runs,
            at: SystemTime::now(),
            clock: Instant::now(),
        }
    }

    /// Reports the run that ended with `outcome` and returns how long to
    /// wait before the next one. A panic in the callback is caught: it must
    /// not take the pruner down with it.
    pub(super) fn finish(
        &mut self,
        start: RunStart,
        outcome: Result<PruneReport, PruneRunError>,
    ) -> Duration {
        self.failures = match outcome {
            Ok(_) => 0,
            Err(_) => self.failures.saturating_add(1),
        };
        let run = PruneRun {
            run: start.run,
            started_at: start.at,
            elapsed: start.clock.elapsed(),
            outcome,
            next_run_in: next_wait(self.every, self.failures),
        };
        #[cfg(feature = "log")]
        match &run.outcome {
            Ok(_) => log::info!(target: "inbox_runtime::prune", "{run}"),
            Err(_) => log::warn!(target: "inbox_runtime::prune", "{run}"),
        }
        let on_run = &mut self.on_run;
        let _ = panic::catch_unwind(AssertUnwindSafe(|| on_run(&run)));
        run.next_run_in
    }
}

#[cfg(feature = "r2d2")]
struct Worker<J, M: ManageConnection, F> {
    job: J,
    checkout_timeout: Duration,
    pool: Pool<M>,
    book: RunBook<F>,
    signals: Arc<Signals>,
}

#[cfg(feature = "r2d2")]
impl<J, M, F> Worker<J, M, F>
where
    M: ManageConnection,
    J: PruneJob<M::Connection>,
    F: FnMut(&PruneRun),
{
    fn run(mut self) {
        while !self.signals.stop_requested() {
            let start = self.book.start();
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| self.run_once()))
                .unwrap_or_else(|panic| Err(panicked(panic)));
            let wait = self.book.finish(start, outcome);
            if !self.signals.wait(wait, true) {
                break;
            }
        }
    }

    fn run_once(&mut self) -> Result<PruneReport, PruneRunError> {
        let mut conn = self
            .pool
            .get_timeout(self.checkout_timeout)
            .map_err(PruneRunError::Checkout)?;
        let signals = &self.signals;
        self.job
            .run_job(&mut conn, &|| signals.stop_requested())
            .map_err(PruneRunError::Prune)
    }
}

/// The error for a job that panicked, caught by the pruner.
pub(super) fn panicked(panic: Box<dyn Any + Send>) -> PruneRunError {
    PruneRunError::Panicked(if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "a non-string panic payload".to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_up_to_the_cap() {
        let ms = Duration::from_millis;
        let waits: Vec<Duration> = (0..5)
            .map(|failures| next_wait(Duration::ZERO, failures))
            .collect();
        assert_eq!(waits, [ms(0), ms(100), ms(200), ms(400), ms(800)]);
        assert_eq!(next_wait(Duration::ZERO, 40), MAX_RETRY_BACKOFF);
        assert_eq!(
            next_wait(ms(300), 1),
            ms(300),
            "the interval when it is longer"
        );
        assert_eq!(next_wait(ms(300), 3), ms(400));
        assert_eq!(next_wait(Duration::MAX, 3), Duration::MAX);
    }
}
