//! The background pruner on a thread of its own, over an r2d2 pool
//! (feature `r2d2`): the [scheduling loop](super::scheduler) with a
//! blocking front end, which checks connections out of the pool and waits
//! on a condition variable.

use std::future::Future;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use diesel::r2d2::{ManageConnection, Pool};

use super::PruneReport;
use super::scheduler::{
    BackgroundPruner, FrontEnd, PruneJob, PrunerRun, PrunerRunError, RunLog, StopSignal, schedule,
};
use crate::execution::{Signals, block_ready};

impl<J> BackgroundPruner<J> {
    /// Starts the thread. `on_run` receives every run's [`PrunerRun`]; with
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
    pub fn spawn<M, F>(self, pool: Pool<M>, on_run: F) -> std::io::Result<PrunerThread>
    where
        M: ManageConnection,
        J: PruneJob<M::Connection>,
        F: FnMut(&PrunerRun) + Send + 'static,
    {
        let signals = Arc::new(Signals::default());
        let front = ThreadFront {
            job: self.job,
            pool,
            checkout_timeout: self.checkout_timeout,
            signals: Arc::clone(&signals),
        };
        let log = RunLog::new(self.every, on_run);
        let thread_signals = Arc::clone(&signals);
        let thread = thread::Builder::new()
            .name(self.thread_name)
            .spawn(move || block_ready(schedule(front, log, &thread_signals)))?;
        Ok(PrunerThread {
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
#[derive(Debug)]
pub struct PrunerThread {
    signals: Arc<Signals>,
    thread: Option<JoinHandle<()>>,
}

impl PrunerThread {
    /// Starts the next run now instead of at the end of the interval (if a
    /// run is in progress, another follows it right away).
    ///
    /// ```no_run
    /// # fn f(handle: &inbox_runtime::prune::PrunerThread) {
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
    /// # fn f(handle: inbox_runtime::prune::PrunerThread) {
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
    /// # fn f(handle: &inbox_runtime::prune::PrunerThread) {
    /// assert!(!handle.is_finished());
    /// # }
    /// ```
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for PrunerThread {
    fn drop(&mut self) {
        self.signals.request_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread's front end: a connection checked out of the pool (waiting at
/// most the checkout timeout), the job on it, and a blocking wait.
struct ThreadFront<J, M: ManageConnection> {
    job: J,
    pool: Pool<M>,
    checkout_timeout: Duration,
    signals: Arc<Signals>,
}

impl<J, M> FrontEnd for ThreadFront<J, M>
where
    M: ManageConnection,
    J: PruneJob<M::Connection>,
{
    /// An `async fn`, so the run happens when polled (inside the loop's
    /// panic guard), not when the future is made.
    async fn run_once(&mut self) -> Result<PruneReport, PrunerRunError> {
        let mut conn = self
            .pool
            .get_timeout(self.checkout_timeout)
            .map_err(PrunerRunError::Checkout)?;
        self.job
            .run_job(&mut conn, &StopSignal::new(&self.signals))
            .map_err(PrunerRunError::Prune)
    }

    fn wait(&mut self, delay: Duration) -> impl Future<Output = bool> {
        std::future::ready(self.signals.wait(delay, true))
    }
}
