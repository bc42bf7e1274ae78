//! The relay as a tokio task over a diesel-async pool: a connection
//! checked out for each round (bounded by the checkout timeout), an async
//! wait between rounds.

use std::sync::Arc;
use std::time::Duration;

use super::{BackgroundRelay, RelayFront, RelayRound, RelayRoundError, relay_loop};
use crate::background::{AsyncPool, WorkerTask, checkout};
use crate::execution::Signals;
use crate::outbox::publisher::Publisher;
use crate::outbox::relay::{Relay, RelayReport};

impl BackgroundRelay {
    /// Starts the relay as a task on the current tokio runtime, checking a
    /// connection out of `pool` (deadpool or bb8) for each round and
    /// publishing through `publisher`; `on_round` sees every round, on the
    /// task (keep it quick). The [`WorkerTask`] stops it (dropping it does
    /// too) and starts a round at once ([`run_now`](WorkerTask::run_now)).
    ///
    /// Stopping waits for the round in flight: a round is never cut
    /// between the broker's confirmation and its mark. Only a runtime
    /// shutting down drops it there; its messages stay leased and go out
    /// again, under the same ids, when the lease runs out.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, like [`tokio::spawn`].
    ///
    /// ```no_run
    /// # #[cfg(all(feature = "postgres", feature = "deadpool"))]
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use diesel_async::pooled_connection::{deadpool::Pool, AsyncDieselConnectionManager};
    /// use diesel_async::AsyncPgConnection;
    /// use inbox_runtime::outbox::{BackgroundRelay, OutboxMessage, PublishError, Publisher, Relay};
    ///
    /// struct Broker;
    /// impl Publisher for Broker {
    ///     async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
    ///         messages.iter().map(|_| Ok(())).collect()
    ///     }
    /// }
    ///
    /// let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new("postgres://localhost/app");
    /// let pool = Pool::builder(manager).max_size(4).build()?;
    /// let relay = BackgroundRelay::new(Relay::new()).spawn_task(pool, Broker, |round| {
    ///     if !round.is_ok() {
    ///         eprintln!("{round}");
    ///     }
    /// });
    /// // … on shutdown:
    /// relay.stop().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawn_task<P, B, F>(self, pool: P, publisher: B, on_round: F) -> WorkerTask
    where
        P: AsyncPool,
        B: Publisher + 'static,
        F: FnMut(&RelayRound) + Send + 'static,
    {
        WorkerTask::spawn(move |signals| async move {
            let mut front = TaskFront {
                relay: self.relay.clone(),
                checkout_timeout: self.checkout_timeout,
                pool,
                publisher,
                signals: Arc::clone(&signals),
                #[cfg(feature = "postgres")]
                listener: self.listener(),
            };
            relay_loop(&self, &mut front, &signals, on_round).await;
        })
    }
}

/// The task's front end: a connection from the async pool per round, and
/// an async wait on the signals.
struct TaskFront<P, B> {
    relay: Relay,
    checkout_timeout: Duration,
    pool: P,
    publisher: B,
    signals: Arc<Signals>,
    #[cfg(feature = "postgres")]
    listener: Option<super::listen::CommitListener>,
}

impl<P: AsyncPool, B: Publisher> RelayFront for TaskFront<P, B> {
    async fn round(&mut self) -> Result<RelayReport, RelayRoundError> {
        let mut conn = checkout(&self.pool, self.checkout_timeout)
            .await
            .map_err(|error| RelayRoundError::Checkout(error.to_string()))?;
        self.relay
            .run_once_async(&mut *conn, &mut self.publisher)
            .await
            .map_err(RelayRoundError::Relay)
    }

    async fn wait(&mut self, delay: Duration, wakeable: bool) -> bool {
        #[cfg(feature = "postgres")]
        if let Some(listener) = self.listener.as_mut().filter(|_| wakeable) {
            let signals = &self.signals;
            return super::listen::wait_listening(
                listener,
                delay,
                |slice| signals.wait_for_async(slice, true),
                // Connecting blocks: off the runtime's workers.
                |url| async move {
                    tokio::task::spawn_blocking(move || super::listen::connect(&url))
                        .await
                        .unwrap_or_else(|error| Err(error.to_string()))
                },
            )
            .await;
        }
        self.signals.wait_async(delay, wakeable).await
    }
}
