//! Pruning on an interval in the background: a thread over an r2d2 pool
//! (feature `r2d2`, [`BackgroundPruner::spawn`]) or a tokio task over a
//! diesel-async pool (feature `tokio`, [`BackgroundPruner::spawn_task`]).
//! Both run the one scheduling loop of this module ([`schedule`]) and share
//! the builder, the run reports, the stop and run-now signals and the
//! backoff after failures; a front end ([`FrontEnd`]: `thread`, `task`)
//! only checks a connection out and waits, blocking or async. Stopping is
//! signalled (a condition variable wakes a thread, a `Notify` a task),
//! never polled.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::ops::ControlFlow;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant, SystemTime};

#[cfg(feature = "r2d2")]
use diesel::connection::LoadConnection;
#[cfg(feature = "r2d2")]
use diesel::r2d2::PoolError;

#[cfg(feature = "r2d2")]
use super::Prune;
#[cfg(feature = "r2d2")]
use super::driver::{Blocking, drive};
use super::{PruneError, PruneReport};
#[cfg(feature = "r2d2")]
use crate::backend::InboxBackend;
use crate::duration::format_duration;
#[cfg(feature = "r2d2")]
use crate::execution::block_ready;
use crate::execution::{Signals, caught};

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
/// `stop` tells when the pruner's handle asks it to stop; a long job checks
/// it between batches and returns early, and pauses through it (a stop
/// request ends the pause at once).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{Prune, RetentionPolicy, prune::{PruneJob, StopSignal}};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let mut job = Prune::new(RetentionPolicy::parse("7d", "1d")?);
/// let report = PruneJob::<SqliteConnection>::run_job(&mut job, &mut conn, &StopSignal::never())?;
/// assert!(report.caught_up);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "r2d2")]
pub trait PruneJob<C>: Send + 'static {
    /// Runs the job once on `conn`.
    fn run_job(&mut self, conn: &mut C, stop: &StopSignal<'_>) -> Result<PruneReport, PruneError>;
}

#[cfg(feature = "r2d2")]
impl<C> PruneJob<C> for Prune
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    fn run_job(&mut self, conn: &mut C, stop: &StopSignal<'_>) -> Result<PruneReport, PruneError> {
        let pause = |wait| stop.pause(wait);
        let progress = |_: &super::BatchProgress<'_>| go_on(!stop.is_requested());
        block_ready(drive(self, &mut Blocking { conn, pause }, progress))
    }
}

/// A [`PruneJob`]'s view of its pruner's stop requests.
///
/// ```
/// use std::time::Duration;
/// use inbox_runtime::prune::StopSignal;
///
/// let never = StopSignal::never();
/// assert!(!never.is_requested());
/// assert!(never.pause(Duration::from_millis(1)).is_continue());
/// ```
#[cfg(feature = "r2d2")]
#[derive(Debug, Clone, Copy)]
pub struct StopSignal<'s> {
    signals: Option<&'s Signals>,
}

#[cfg(feature = "r2d2")]
impl StopSignal<'static> {
    /// A signal no stop request ever comes through: for running a job by
    /// hand.
    ///
    /// ```
    /// assert!(!inbox_runtime::prune::StopSignal::never().is_requested());
    /// ```
    pub fn never() -> Self {
        StopSignal { signals: None }
    }
}

#[cfg(feature = "r2d2")]
impl<'s> StopSignal<'s> {
    pub(super) fn new(signals: &'s Signals) -> Self {
        StopSignal {
            signals: Some(signals),
        }
    }

    /// `true` once the pruner is asked to stop.
    ///
    /// ```
    /// assert!(!inbox_runtime::prune::StopSignal::never().is_requested());
    /// ```
    pub fn is_requested(&self) -> bool {
        self.signals.is_some_and(Signals::stop_requested)
    }

    /// Sleeps `pause`, woken at once by a stop request: `Break` then.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let flow = inbox_runtime::prune::StopSignal::never().pause(Duration::ZERO);
    /// assert!(flow.is_continue());
    /// ```
    pub fn pause(&self, pause: Duration) -> ControlFlow<()> {
        match self.signals {
            Some(signals) => go_on(signals.wait(pause, false)),
            None => {
                std::thread::sleep(pause);
                ControlFlow::Continue(())
            }
        }
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

/// Why a background run failed.
///
/// ```
/// use inbox_runtime::prune::PrunerRunError;
/// let err = PrunerRunError::Panicked("boom".into());
/// assert_eq!(err.to_string(), "the pruning job panicked: boom");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum PrunerRunError {
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

impl fmt::Display for PrunerRunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "r2d2")]
            PrunerRunError::Checkout(error) => write!(f, "no database connection: {error}"),
            #[cfg(feature = "tokio")]
            PrunerRunError::AsyncCheckout(error) => write!(f, "no database connection: {error}"),
            PrunerRunError::Prune(error) => error.fmt(f),
            PrunerRunError::Panicked(message) => write!(f, "the pruning job panicked: {message}"),
        }
    }
}

impl std::error::Error for PrunerRunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            #[cfg(feature = "r2d2")]
            PrunerRunError::Checkout(error) => Some(error),
            #[cfg(feature = "tokio")]
            PrunerRunError::AsyncCheckout(error) => Some(&**error),
            PrunerRunError::Prune(error) => Some(error),
            PrunerRunError::Panicked(_) => None,
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
/// use inbox_runtime::{Prune, RetentionPolicy, prune::{BackgroundPruner, PrunerRun}};
///
/// let pool = Pool::new(ConnectionManager::<diesel::PgConnection>::new("postgres://localhost/app"))?;
/// let (runs, received) = mpsc::channel::<String>();
/// let handle = BackgroundPruner::new(Prune::new(RetentionPolicy::parse("7d", "2d")?))
///     .spawn(pool, move |run: &PrunerRun| {
///         let _ = runs.send(run.to_string());
///     })?;
/// println!("{}", received.recv()?); // "prune run 1: deleted 12000 rows in 3 batches in 48.0 ms (caught up)"
/// handle.stop();
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct PrunerRun {
    /// The run's number, from 1.
    pub run: u64,
    /// When it started (wall clock, for logs).
    pub started_at: SystemTime,
    /// How long it took, checkout included.
    pub elapsed: Duration,
    /// What it did, or why it failed. A failed run is retried at the next
    /// interval.
    pub outcome: Result<PruneReport, PrunerRunError>,
    /// How long the pruner waits before its next run, unless stopped or
    /// woken by `run_now`: the interval, or after failed runs in a row at
    /// least a backoff (see [`MAX_RETRY_BACKOFF`]).
    pub next_run_in: Duration,
}

impl PrunerRun {
    /// `true` when the run succeeded.
    ///
    /// ```
    /// # fn check(run: &inbox_runtime::prune::PrunerRun) {
    /// if !run.is_ok() { eprintln!("{run}"); }
    /// # }
    /// ```
    pub fn is_ok(&self) -> bool {
        self.outcome.is_ok()
    }
}

impl fmt::Display for PrunerRun {
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
/// let prune = Prune::new(RetentionPolicy::parse("7d", "2d")?).batch_size(5_000);
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
    pub(super) thread_name: String,
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
}

/// A pruner's runs: numbering, timing, the report callback (and log), and
/// the wait before the next run.
pub(super) struct RunLog<F> {
    on_run: F,
    every: Duration,
    runs: u64,
    /// Failed runs in a row.
    failures: u32,
}

/// A run in progress.
pub(super) struct RunStarted {
    run: u64,
    at: SystemTime,
    clock: Instant,
}

impl<F: FnMut(&PrunerRun)> RunLog<F> {
    pub(super) fn new(every: Duration, on_run: F) -> Self {
        RunLog {
            on_run,
            every,
            runs: 0,
            failures: 0,
        }
    }

    pub(super) fn start(&mut self) -> RunStarted {
        self.runs += 1;
        RunStarted {
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
        start: RunStarted,
        outcome: Result<PruneReport, PrunerRunError>,
    ) -> Duration {
        self.failures = match outcome {
            Ok(_) => 0,
            Err(_) => self.failures.saturating_add(1),
        };
        let run = PrunerRun {
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

/// How a pruner's runs execute and how it waits between them: on a thread
/// of its own (blocking, over an r2d2 pool) or as a tokio task (over a
/// diesel-async pool).
pub(super) trait FrontEnd {
    /// One run: a connection from the pool, then the job on it, stopping
    /// between batches (or in a pause) when asked to.
    fn run_once(&mut self) -> impl Future<Output = Result<PruneReport, PrunerRunError>>;

    /// Waits `delay` for the next run: `false` if a stop request ends the
    /// wait, `true` when it elapses or a run-now request ends it.
    fn wait(&mut self, delay: Duration) -> impl Future<Output = bool>;
}

/// The scheduling loop of every pruner: runs until stopped, each run
/// reported to `log` (a panic in the run or the report is caught), then
/// waits the interval (or the backoff).
pub(super) async fn schedule<E, F>(mut front: E, mut log: RunLog<F>, signals: &Signals)
where
    E: FrontEnd,
    F: FnMut(&PrunerRun),
{
    while !signals.stop_requested() {
        let start = log.start();
        let outcome = caught(front.run_once())
            .await
            .unwrap_or_else(|panic| Err(panicked(panic)));
        let wait = log.finish(start, outcome);
        if !front.wait(wait).await {
            break;
        }
    }
}

/// The error for a job that panicked, caught by the pruner.
pub(super) fn panicked(panic: Box<dyn Any + Send>) -> PrunerRunError {
    PrunerRunError::Panicked(crate::text::panic_text(panic.as_ref()).to_owned())
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
