//! The stop and run-now requests of a background worker (the pruner, the
//! outbox relay), and how its thread (a condition variable) or tokio task
//! (a `Notify`) waits for them: signalled, never polled.

// Without a thread or a task to wait (features `r2d2`, `tokio`), the
// signals are only the pruner's stop flag type.
#![cfg_attr(not(any(feature = "r2d2", feature = "tokio")), allow(dead_code))]

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
#[cfg(any(feature = "r2d2", feature = "tokio"))]
use std::time::Duration;
#[cfg(feature = "r2d2")]
use std::time::Instant;

/// A background worker's stop and run-now requests (the pruner's, the
/// outbox relay's), and how its thread or task waits for them.
#[derive(Debug, Default)]
pub(crate) struct Signals {
    state: Mutex<State>,
    /// Wakes a waiting thread.
    wake: Condvar,
    /// Wakes a waiting task.
    #[cfg(feature = "tokio")]
    notify: tokio::sync::Notify,
}

/// What ended a wait ([`Signals::wait_for`], [`Signals::wait_for_async`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// A stop request.
    Stopped,
    /// A run-now request (taken).
    RunNow,
    /// The delay.
    Elapsed,
}

#[derive(Debug, Default)]
struct State {
    stop: bool,
    run_now: bool,
}

impl Signals {
    pub(crate) fn request_stop(&self) {
        self.lock().stop = true;
        self.wake_up();
    }

    pub(crate) fn request_run(&self) {
        self.lock().run_now = true;
        self.wake_up();
    }

    pub(crate) fn stop_requested(&self) -> bool {
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

    /// Whether a wait ends now: on a stop request, or on a run-now request
    /// (taken) when waiting `for_run`.
    fn settled(state: &mut State, for_run: bool) -> Option<Waited> {
        if state.stop {
            Some(Waited::Stopped)
        } else if for_run && state.run_now {
            state.run_now = false;
            Some(Waited::RunNow)
        } else {
            None
        }
    }

    /// Blocks the thread for `delay` (forever for a `delay` past the end of
    /// time): `false` if a stop request ends the wait, `true` otherwise. A
    /// wait `for_run` (the next run) also ends on a run-now request; a pause
    /// between batches does not.
    #[cfg(feature = "r2d2")]
    pub(crate) fn wait(&self, delay: Duration, for_run: bool) -> bool {
        self.wait_for(delay, for_run) != Waited::Stopped
    }

    /// [`wait`](Self::wait), saying what ended it.
    #[cfg(feature = "r2d2")]
    pub(crate) fn wait_for(&self, delay: Duration, for_run: bool) -> Waited {
        let deadline = Instant::now().checked_add(delay);
        let mut state = self.lock();
        loop {
            if let Some(waited) = Self::settled(&mut state, for_run) {
                return waited;
            }
            state = match deadline {
                None => self
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Waited::Elapsed;
                    }
                    let waited = self.wake.wait_timeout(state, deadline - now);
                    waited.unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
    }

    /// [`wait`](Self::wait) for a tokio task.
    #[cfg(feature = "tokio")]
    pub(crate) async fn wait_async(&self, delay: Duration, for_run: bool) -> bool {
        self.wait_for_async(delay, for_run).await != Waited::Stopped
    }

    /// [`wait_for`](Self::wait_for) for a tokio task.
    #[cfg(feature = "tokio")]
    pub(crate) async fn wait_for_async(&self, delay: Duration, for_run: bool) -> Waited {
        let deadline = tokio::time::Instant::now().checked_add(delay);
        loop {
            if let Some(waited) = Self::settled(&mut self.lock(), for_run) {
                return waited;
            }
            let woken = self.notify.notified();
            match deadline {
                None => woken.await,
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, woken).await.is_err() {
                        return Self::settled(&mut self.lock(), for_run).unwrap_or(Waited::Elapsed);
                    }
                }
            }
        }
    }
}
