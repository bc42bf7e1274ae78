//! The background pruner on a thread of its own, over an r2d2 pool
//! (feature `r2d2`): the [scheduling loop](super::scheduler) with a
//! blocking front end, which checks connections out of the pool and waits
//! on a condition variable.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use diesel::r2d2::{ManageConnection, Pool};

use super::PruneReport;
use super::scheduler::{
    BackgroundPruner, FrontEnd, PruneJob, PrunerRun, PrunerRunError, RunLog, StopSignal, schedule,
};
use crate::background::WorkerThread;
use crate::execution::{Signals, block_ready};

impl<J> BackgroundPruner<J> {
    /// Starts the thread. `on_run` receives every run's [`PrunerRun`]; with
    /// the `log` feature, runs are also logged (info, or warn on failure).
    /// The [`WorkerThread`] stops it (dropping it does too).
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
    pub fn spawn<M, F>(self, pool: Pool<M>, on_run: F) -> std::io::Result<WorkerThread>
    where
        M: ManageConnection,
        J: PruneJob<M::Connection>,
        F: FnMut(&PrunerRun) + Send + 'static,
    {
        WorkerThread::spawn(self.thread_name, move |signals| {
            let front = ThreadFront {
                job: self.job,
                pool,
                checkout_timeout: self.checkout_timeout,
                signals: Arc::clone(&signals),
            };
            block_ready(schedule(front, RunLog::new(self.every, on_run), &signals));
        })
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
