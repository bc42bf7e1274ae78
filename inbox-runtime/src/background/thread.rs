//! The handle of a background worker on a thread of its own.

use std::sync::Arc;
use std::thread::{self, JoinHandle};

use crate::execution::Signals;

/// Controls a background worker running on a thread of its own (a
/// [`BackgroundPruner`](crate::prune::BackgroundPruner) or a
/// [`BackgroundRelay`](crate::outbox::BackgroundRelay) started with
/// `spawn`). Dropping it stops the thread and waits for it.
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
pub struct WorkerThread {
    signals: Arc<Signals>,
    thread: Option<JoinHandle<()>>,
}

impl WorkerThread {
    /// Starts a thread named `name` running `work`, which gets the signals
    /// the handle sends.
    pub(crate) fn spawn<W>(name: String, work: W) -> std::io::Result<WorkerThread>
    where
        W: FnOnce(Arc<Signals>) + Send + 'static,
    {
        let signals = Arc::new(Signals::default());
        let thread_signals = Arc::clone(&signals);
        let thread = thread::Builder::new()
            .name(name)
            .spawn(move || work(thread_signals))?;
        Ok(WorkerThread {
            signals,
            thread: Some(thread),
        })
    }

    /// Starts the next run now instead of at the end of the wait (the
    /// pruner's interval, the relay's idle wait); if a run is in progress,
    /// another follows it right away.
    ///
    /// ```no_run
    /// # fn f(handle: &inbox_runtime::background::WorkerThread) {
    /// handle.run_now();
    /// # }
    /// ```
    pub fn run_now(&self) {
        self.signals.request_run();
    }

    /// Stops the thread and waits for it: a run in progress ends first (a
    /// pruning run after its current batch, or at once if it is pausing
    /// between batches; a relay round after its publish). `Err` only if the
    /// thread itself panicked, which the workers are built not to do (a
    /// panicking job, publisher or callback is caught and reported).
    ///
    /// ```no_run
    /// # fn f(handle: inbox_runtime::background::WorkerThread) {
    /// handle.stop().expect("a background worker never panics");
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
    /// # fn f(handle: &inbox_runtime::background::WorkerThread) {
    /// assert!(!handle.is_finished());
    /// # }
    /// ```
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for WorkerThread {
    fn drop(&mut self) {
        self.signals.request_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
