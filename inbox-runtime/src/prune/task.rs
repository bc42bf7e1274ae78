//! The background pruner as a tokio task over a diesel-async pool (feature
//! `tokio`): the [scheduling loop](super::scheduler) with an async front
//! end, which checks connections out of the pool and waits on a `Notify`.
//! The same builder, reports, signals and backoff as the thread.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::ops::DerefMut;
use std::sync::Arc;
use std::time::Duration;

use diesel_async::AsyncConnection;
use tokio::task::{JoinError, JoinHandle};

use super::driver::{Async, drive};
use super::scheduler::{FrontEnd, RunLog, go_on, schedule};
use super::{BackgroundPruner, Prune, PruneReport, PrunerRun, PrunerRunError};
use crate::backend::InboxBackend;
use crate::execution::Signals;

/// An async connection pool a pruning task checks its connections out of:
/// diesel-async's deadpool pool (feature `deadpool`) or bb8 pool (feature
/// `bb8`), or a pool of your own.
///
/// ```
/// # #[cfg(all(feature = "postgres", feature = "deadpool"))] {
/// use diesel_async::pooled_connection::deadpool::Pool;
/// use inbox_runtime::prune::AsyncPrunePool;
///
/// fn assert_pool<P: AsyncPrunePool>() {}
/// assert_pool::<Pool<diesel_async::AsyncPgConnection>>();
/// # }
/// ```
pub trait AsyncPrunePool: Send + Sync + 'static {
    /// The pool's connections.
    type Connection: AsyncConnection<Backend: InboxBackend> + Send + 'static;

    /// A checked-out connection, returned to the pool when dropped.
    type Pooled<'p>: DerefMut<Target = Self::Connection> + Send
    where
        Self: 'p;

    /// Checks a connection out of the pool (the pruner bounds the wait by
    /// its [`checkout_timeout`](BackgroundPruner::checkout_timeout)).
    fn checkout(
        &self,
    ) -> impl Future<Output = Result<Self::Pooled<'_>, Box<dyn Error + Send + Sync>>> + Send;
}

/// Implements [`AsyncPrunePool`] for a diesel-async pool module's `Pool`,
/// whose checked-out connection is `$pooled`.
macro_rules! async_prune_pool {
    ($feature:literal, $module:ident, $pooled:ty) => {
        #[cfg(feature = $feature)]
        impl<C> AsyncPrunePool for diesel_async::pooled_connection::$module::Pool<C>
        where
            C: diesel_async::pooled_connection::PoolableConnection<Backend: InboxBackend> + 'static,
            for<'a> diesel::dsl::select<diesel::dsl::AsExprOf<i32, diesel::sql_types::Integer>>:
                diesel_async::methods::LoadQuery<'a, C, i32>,
            diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
        {
            type Connection = C;
            type Pooled<'p> = $pooled;

            async fn checkout(&self) -> Result<Self::Pooled<'_>, Box<dyn Error + Send + Sync>> {
                Ok(self.get().await?)
            }
        }
    };
}

async_prune_pool!(
    "deadpool",
    deadpool,
    diesel_async::pooled_connection::deadpool::Object<C>
);
async_prune_pool!(
    "bb8",
    bb8,
    diesel_async::pooled_connection::bb8::PooledConnection<'p, C>
);

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
    pub fn spawn_task<P, F>(self, pool: P, on_run: F) -> PrunerTask
    where
        P: AsyncPrunePool,
        F: FnMut(&PrunerRun) + Send + 'static,
    {
        let signals = Arc::new(Signals::default());
        let front = TaskFront {
            prune: self.job,
            pool,
            checkout_timeout: self.checkout_timeout,
            signals: Arc::clone(&signals),
        };
        let log = RunLog::new(self.every, on_run);
        let task_signals = Arc::clone(&signals);
        let task = tokio::spawn(async move { schedule(front, log, &task_signals).await });
        PrunerTask {
            signals,
            task: Some(task),
        }
    }
}

/// Controls a pruning task started by
/// [`BackgroundPruner::spawn_task`]. Dropping it stops the task: it ends
/// after the batch in flight, on its own.
///
/// ```no_run
/// # async fn demo(task: inbox_runtime::prune::PrunerTask) {
/// task.run_now(); // don't wait for the interval
/// task.stop().await.expect("the pruning task never panics");
/// # }
/// ```
#[derive(Debug)]
pub struct PrunerTask {
    signals: Arc<Signals>,
    task: Option<JoinHandle<()>>,
}

impl PrunerTask {
    /// Starts the next run now instead of at the end of the interval (if a
    /// run is in progress, another follows it right away).
    ///
    /// ```no_run
    /// # fn f(task: &inbox_runtime::prune::PrunerTask) {
    /// task.run_now();
    /// # }
    /// ```
    pub fn run_now(&self) {
        self.signals.request_run();
    }

    /// Stops the task and waits for it to end: a run in progress ends after
    /// its current batch (or its connection checkout, or at once if it is
    /// pausing), and is reported. `Err` only if the runtime shut down first,
    /// or the task panicked, which the pruner is built not to do.
    ///
    /// ```no_run
    /// # async fn demo(task: inbox_runtime::prune::PrunerTask) {
    /// task.stop().await.expect("stopped cleanly");
    /// # }
    /// ```
    pub async fn stop(mut self) -> Result<(), JoinError> {
        self.signals.request_stop();
        match self.task.take() {
            Some(task) => task.await,
            None => Ok(()),
        }
    }

    /// `true` once the task has ended.
    ///
    /// ```no_run
    /// # fn f(task: &inbox_runtime::prune::PrunerTask) {
    /// assert!(!task.is_finished());
    /// # }
    /// ```
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for PrunerTask {
    fn drop(&mut self) {
        self.signals.request_stop();
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

impl<P: AsyncPrunePool> FrontEnd for TaskFront<P> {
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
async fn run_once<P: AsyncPrunePool>(
    prune: &Prune,
    pool: &P,
    checkout_timeout: Duration,
    signals: &Signals,
) -> Result<PruneReport, PrunerRunError> {
    let mut conn = match tokio::time::timeout(checkout_timeout, pool.checkout()).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(error)) => return Err(PrunerRunError::AsyncCheckout(error)),
        Err(_) => {
            let timed_out = CheckoutTimedOut(checkout_timeout);
            return Err(PrunerRunError::AsyncCheckout(Box::new(timed_out)));
        }
    };
    let pause = |pause| async move { go_on(signals.wait_async(pause, false).await) };
    let progress = |_: &super::BatchProgress<'_>| go_on(!signals.stop_requested());
    let conn = &mut *conn;
    drive(prune, &mut Async { conn, pause }, progress)
        .await
        .map_err(PrunerRunError::Prune)
}

/// The pool gave no connection within the checkout timeout.
#[derive(Debug)]
struct CheckoutTimedOut(Duration);

impl fmt::Display for CheckoutTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the pool gave no connection within {}",
            crate::duration::format_duration(self.0)
        )
    }
}

impl Error for CheckoutTimedOut {}
