//! The background pruner as a tokio task over a diesel-async pool (feature
//! `tokio`): the [scheduling loop](super::scheduler) with an async front
//! end, which checks connections out of the pool and waits on a `Notify`.
//! The same builder, reports, signals and backoff as the thread.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::driver::{Async, drive};
use super::scheduler::{FrontEnd, RunLog, go_on, schedule};
use super::{BackgroundPruner, Prune, PruneReport, PrunerRun, PrunerRunError};
use crate::background::{AsyncPool, WorkerTask, checkout};
use crate::execution::Signals;

impl BackgroundPruner<Prune> {
    /// Starts the pruner as a task on the current tokio runtime, over an
    /// async pool (deadpool or bb8). `on_run` receives every run's
    /// [`PrunerRun`], as with the thread ([`spawn`](Self::spawn)), on the
    /// task (keep it quick: log, or send to a channel); with the `log`
    /// feature, runs are also logged.
    ///
    /// The task honours the [`pause`](Prune::pause) between batches (a stop
    /// request cuts it short). It never aborts a batch: stopping waits for
    /// the batch in flight to commit, so no connection goes back to the pool
    /// inside a transaction. Only a runtime shutting down drops the task
    /// mid-batch; the batch's connection is then marked broken, so the pool
    /// discards it and the server rolls the batch back.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, like [`tokio::spawn`].
    ///
    /// ```no_run
    /// # #[cfg(all(feature = "postgres", feature = "deadpool"))]
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use diesel_async::pooled_connection::{deadpool::Pool, AsyncDieselConnectionManager};
    /// use diesel_async::AsyncPgConnection;
    /// use inbox_runtime::{Prune, RetentionPolicy, prune::BackgroundPruner};
    ///
    /// let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new("postgres://localhost/app");
    /// let pool = Pool::builder(manager).max_size(4).build()?;
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "2d")?)
    ///     .batch_size(5_000)
    ///     .pause(Duration::from_millis(20));
    /// let pruner = BackgroundPruner::new(prune)
    ///     .every(Duration::from_secs(60))
    ///     .spawn_task(pool.clone(), |run| {
    ///         if !run.is_ok() {
    ///             eprintln!("{run}"); // "prune run 7 failed (retrying in 60s): …"
    ///         }
    ///     });
    /// // ... serve messages from the same pool ...
    /// pruner.stop().await?; // waits for the batch in flight; dropping `pruner` stops it too
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawn_task<P, F>(self, pool: P, on_run: F) -> WorkerTask
    where
        P: AsyncPool,
        F: FnMut(&PrunerRun) + Send + 'static,
    {
        WorkerTask::spawn(move |signals| async move {
            let front = TaskFront {
                prune: self.job,
                pool,
                checkout_timeout: self.checkout_timeout,
                signals: Arc::clone(&signals),
            };
            schedule(front, RunLog::new(self.every, on_run), &signals).await;
        })
    }
}

/// The task's front end: a connection checked out of the async pool
/// (waiting at most the checkout timeout), the prune on it, and an async
/// wait.
struct TaskFront<P> {
    prune: Prune,
    pool: P,
    checkout_timeout: Duration,
    signals: Arc<Signals>,
}

impl<P: AsyncPool> FrontEnd for TaskFront<P> {
    fn run_once(&mut self) -> impl Future<Output = Result<PruneReport, PrunerRunError>> {
        run_once(
            &self.prune,
            &self.pool,
            self.checkout_timeout,
            &self.signals,
        )
    }

    fn wait(&mut self, delay: Duration) -> impl Future<Output = bool> {
        self.signals.wait_async(delay, true)
    }
}

/// One run: a connection from the pool, then the prune on it, stopping
/// between batches (or in a pause) when asked to.
async fn run_once<P: AsyncPool>(
    prune: &Prune,
    pool: &P,
    checkout_timeout: Duration,
    signals: &Signals,
) -> Result<PruneReport, PrunerRunError> {
    let mut conn = checkout(pool, checkout_timeout)
        .await
        .map_err(PrunerRunError::AsyncCheckout)?;
    let pause = |pause| async move { go_on(signals.wait_async(pause, false).await) };
    let progress = |_: &super::BatchProgress<'_>| go_on(!signals.stop_requested());
    let conn = &mut *conn;
    drive(prune, &mut Async { conn, pause }, progress)
        .await
        .map_err(PrunerRunError::Prune)
}
