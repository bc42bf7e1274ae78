//! The relay on a thread of its own over an r2d2 pool: a connection
//! checked out for each round, a blocking wait between rounds.

use std::future::{Ready, ready};
use std::sync::Arc;
use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::r2d2::{ManageConnection, Pool};

use super::{BackgroundRelay, RelayFront, RelayRound, RelayRoundError, relay_loop};
use crate::backend::InboxBackend;
use crate::background::WorkerThread;
use crate::execution::{Signals, block_ready};
use crate::outbox::publisher::BlockingPublisher;
use crate::outbox::relay::{Relay, RelayReport};

impl BackgroundRelay {
    /// Starts the relay on a thread of its own, checking a connection out
    /// of `pool` for each round and publishing through `publisher`;
    /// `on_round` sees every round (keep it quick: log, count). The
    /// [`WorkerThread`] stops it (dropping it does too) and starts a round
    /// at once ([`run_now`](WorkerThread::run_now)).
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")] {
    /// use diesel::r2d2::{ConnectionManager, Pool};
    /// use inbox_runtime::outbox::{BackgroundRelay, BlockingPublisher, OutboxMessage, PublishError, Relay};
    ///
    /// struct Broker;
    /// impl BlockingPublisher for Broker {
    ///     fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
    ///         messages.iter().map(|_| Ok(())).collect()
    ///     }
    /// }
    ///
    /// let pool = Pool::new(ConnectionManager::<diesel::PgConnection>::new("postgres://localhost/app"))?;
    /// let relay = BackgroundRelay::new(Relay::new()).spawn(pool, Broker, |round| println!("{round}"))?;
    /// // … on shutdown:
    /// relay.stop().expect("the relay thread never panics");
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spawn<M, P, F>(
        self,
        pool: Pool<M>,
        publisher: P,
        on_round: F,
    ) -> std::io::Result<WorkerThread>
    where
        M: ManageConnection,
        M::Connection: LoadConnection,
        <M::Connection as diesel::Connection>::Backend: InboxBackend,
        P: BlockingPublisher + Send + 'static,
        F: FnMut(&RelayRound) + Send + 'static,
    {
        WorkerThread::spawn(self.thread_name.clone(), move |signals| {
            let mut front = ThreadFront {
                relay: self.relay.clone(),
                checkout_timeout: self.checkout_timeout,
                pool,
                publisher,
                signals: Arc::clone(&signals),
                #[cfg(feature = "postgres")]
                listener: self.listener(),
            };
            block_ready(relay_loop(&self, &mut front, &signals, on_round));
        })
    }
}

/// The thread's front end: a connection from the pool per round, and a
/// blocking wait on the signals.
struct ThreadFront<M: ManageConnection, P> {
    relay: Relay,
    checkout_timeout: Duration,
    pool: Pool<M>,
    publisher: P,
    signals: Arc<Signals>,
    #[cfg(feature = "postgres")]
    listener: Option<super::listen::CommitListener>,
}

// `wait` returns `Ready`: a blocking loop completes in one poll.
#[allow(refining_impl_trait)]
impl<M, P> RelayFront for ThreadFront<M, P>
where
    M: ManageConnection,
    M::Connection: LoadConnection,
    <M::Connection as diesel::Connection>::Backend: InboxBackend,
    P: BlockingPublisher,
{
    /// An `async fn`, so the round runs when polled (inside the loop's
    /// panic guard), not when the future is made.
    async fn round(&mut self) -> Result<RelayReport, RelayRoundError> {
        let mut conn = self
            .pool
            .get_timeout(self.checkout_timeout)
            .map_err(|error| RelayRoundError::Checkout(error.to_string()))?;
        self.relay
            .run_once(&mut *conn, &mut self.publisher)
            .map_err(RelayRoundError::Relay)
    }

    fn wait(&mut self, delay: Duration, wakeable: bool) -> Ready<bool> {
        #[cfg(feature = "postgres")]
        if let Some(listener) = self.listener.as_mut().filter(|_| wakeable) {
            let signals = &self.signals;
            return ready(block_ready(super::listen::wait_listening(
                listener,
                delay,
                |slice| ready(signals.wait_for(slice, true)),
                |url| ready(super::listen::connect(&url)),
            )));
        }
        ready(self.signals.wait(delay, wakeable))
    }
}
