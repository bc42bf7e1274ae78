//! A background worker as a tokio task: its handle, and the async pools it
//! checks connections out of.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::ops::DerefMut;
use std::sync::Arc;
use std::time::Duration;

use diesel_async::AsyncConnection;
use tokio::task::{JoinError, JoinHandle};

use crate::backend::InboxBackend;
use crate::execution::Signals;

/// An async connection pool a background task checks its connections out
/// of: diesel-async's deadpool pool (feature `deadpool`) or bb8 pool
/// (feature `bb8`), or a pool of your own.
///
/// ```
/// # #[cfg(all(feature = "postgres", feature = "deadpool"))] {
/// use diesel_async::pooled_connection::deadpool::Pool;
/// use inbox_runtime::background::AsyncPool;
///
/// fn assert_pool<P: AsyncPool>() {}
/// assert_pool::<Pool<diesel_async::AsyncPgConnection>>();
/// # }
/// ```
pub trait AsyncPool: Send + Sync + 'static {
    /// The pool's connections.
    type Connection: AsyncConnection<Backend: InboxBackend> + Send + 'static;

    /// A checked-out connection, returned to the pool when dropped.
    type Pooled<'p>: DerefMut<Target = Self::Connection> + Send
    where
        Self: 'p;

    /// Checks a connection out of the pool (the worker bounds the wait by
    /// its checkout timeout).
    fn checkout(
        &self,
    ) -> impl Future<Output = Result<Self::Pooled<'_>, Box<dyn Error + Send + Sync>>> + Send;
}

/// Implements [`AsyncPool`] for a diesel-async pool module's `Pool`, whose
/// checked-out connection is `$pooled`.
macro_rules! async_pool {
    ($feature:literal, $module:ident, $pooled:ty) => {
        #[cfg(feature = $feature)]
        impl<C> AsyncPool for diesel_async::pooled_connection::$module::Pool<C>
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

async_pool!(
    "deadpool",
    deadpool,
    diesel_async::pooled_connection::deadpool::Object<C>
);
async_pool!(
    "bb8",
    bb8,
    diesel_async::pooled_connection::bb8::PooledConnection<'p, C>
);

/// A connection from `pool` within `timeout`: the pool's error, or
/// [`CheckoutTimedOut`].
pub(crate) async fn checkout<P: AsyncPool>(
    pool: &P,
    timeout: Duration,
) -> Result<P::Pooled<'_>, Box<dyn Error + Send + Sync>> {
    match tokio::time::timeout(timeout, pool.checkout()).await {
        Ok(checked_out) => checked_out,
        Err(_) => Err(Box::new(CheckoutTimedOut(timeout))),
    }
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

/// Controls a background worker running as a tokio task (a
/// [`BackgroundPruner`](crate::prune::BackgroundPruner) or a
/// [`BackgroundRelay`](crate::outbox::BackgroundRelay) started with
/// `spawn_task`). Dropping it stops the task: it ends after the work in
/// flight, on its own.
///
/// ```no_run
/// # async fn demo(task: inbox_runtime::background::WorkerTask) {
/// task.run_now(); // don't wait for the interval
/// task.stop().await.expect("a background worker never panics");
/// # }
/// ```
#[derive(Debug)]
pub struct WorkerTask {
    signals: Arc<Signals>,
    task: Option<JoinHandle<()>>,
}

impl WorkerTask {
    /// Spawns `work` on the current tokio runtime; it gets the signals the
    /// handle sends.
    pub(crate) fn spawn<W, F>(work: W) -> WorkerTask
    where
        W: FnOnce(Arc<Signals>) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let signals = Arc::new(Signals::default());
        let task = tokio::spawn(work(Arc::clone(&signals)));
        WorkerTask {
            signals,
            task: Some(task),
        }
    }

    /// Starts the next run now instead of at the end of the wait (the
    /// pruner's interval, the relay's idle wait); if a run is in progress,
    /// another follows it right away.
    ///
    /// ```no_run
    /// # fn f(task: &inbox_runtime::background::WorkerTask) {
    /// task.run_now();
    /// # }
    /// ```
    pub fn run_now(&self) {
        self.signals.request_run();
    }

    /// Stops the task and waits for it to end: a run in progress ends first
    /// (a pruning run after its current batch, its connection checkout, or
    /// at once if it is pausing; a relay round after its publish). `Err`
    /// only if the runtime shut down first, or the task panicked, which the
    /// workers are built not to do.
    ///
    /// ```no_run
    /// # async fn demo(task: inbox_runtime::background::WorkerTask) {
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
    /// # fn f(task: &inbox_runtime::background::WorkerTask) {
    /// assert!(!task.is_finished());
    /// # }
    /// ```
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for WorkerTask {
    fn drop(&mut self) {
        self.signals.request_stop();
    }
}
