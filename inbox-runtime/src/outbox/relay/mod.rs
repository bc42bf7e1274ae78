//! The relay: publishes committed outgoing messages and marks them sent
//! once the broker confirmed them.

mod exec;
mod round;

use std::time::Duration;

use diesel::connection::LoadConnection;

use crate::backend::InboxBackend;
use crate::backoff::Backoff;
use crate::error::InboxError;
use crate::execution::block_ready;
use crate::outbox::publisher::BlockingPublisher;
#[cfg(feature = "async")]
use crate::outbox::publisher::Publisher;

/// The largest [`Relay::batch_size`].
pub const MAX_RELAY_BATCH: u32 = 1000;

/// Publishes the outbox's committed messages, round by round.
///
/// A round ([`run_once`](Self::run_once)):
/// 1. **leases** up to [`batch_size`](Self::batch_size) messages in a short
///    transaction of its own: the oldest pending messages that no other
///    relay holds, that are not waiting for a retry, and that are the first
///    unsent message of their ordering key (so a round holds at most one
///    message per key). On PostgreSQL and MySQL/MariaDB the lease skips the
///    rows another relay is leasing (`FOR UPDATE SKIP LOCKED`), so several
///    relays share the work and never lease the same message at once; a
///    lease lasts [`lease`](Self::lease), after which another relay may
///    take the message over (the relay holding it was killed or stalled);
/// 2. **publishes** them through the publisher, which answers once the
///    broker confirmed each one;
/// 3. **marks** the confirmed ones sent. A refused one
///    ([`PublishError::refused`](super::PublishError::refused)) counts a
///    failed attempt and waits for its retry by [`backoff`](Self::backoff);
///    at [`max_attempts`](Self::max_attempts) it is dead (see
///    [`dead`](super::dead)). One the broker could not take
///    ([`PublishError::unavailable`](super::PublishError::unavailable)) is
///    given back at once, uncounted: back off before the next round
///    ([`RelayReport::unavailable`]).
///
/// What it promises:
/// - **nothing lost**: a message is marked sent only after the broker
///   confirmed it; a relay killed at any point leaves its messages pending
///   (leased until the lease runs out);
/// - **at least once, with a stable id**: a relay killed between the
///   broker's confirmation and the mark (or whose mark fails) publishes
///   the message again when the lease has run out, under the same id, for
///   the consumer's inbox to absorb. Without kills, a message is published
///   once;
/// - **per-key order**: messages with the same ordering key are published
///   in commit order, each only after the one before it was confirmed,
///   whichever relay publishes them; a key whose message waits for a retry
///   (or is dead) holds back its own later messages only.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::outbox::{self, BlockingPublisher, OutboxMessage, OutgoingMessage, PublishError, Relay};
///
/// #[derive(Default)]
/// struct Collect(Vec<OutboxMessage>);
/// impl BlockingPublisher for Collect {
///     fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
///         self.0.extend_from_slice(messages);
///         messages.iter().map(|_| Ok(())).collect()
///     }
/// }
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// conn.transaction(|conn| {
///     outbox::send(conn, &OutgoingMessage::new("receipts", "first").ordering_key("account-1"))?;
///     outbox::send(conn, &OutgoingMessage::new("receipts", "second").ordering_key("account-1"))
/// })?;
///
/// let relay = Relay::new();
/// let mut broker = Collect::default();
/// let report = relay.run_once(&mut conn, &mut broker)?;
/// assert_eq!(report.published, 1, "one message per key and round");
/// relay.run_once(&mut conn, &mut broker)?;
/// assert!(relay.run_once(&mut conn, &mut broker)?.is_idle());
/// let payloads: Vec<&[u8]> = broker.0.iter().map(|m| m.payload.as_slice()).collect();
/// assert_eq!(payloads, [&b"first"[..], &b"second"[..]]);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relay {
    batch_size: u32,
    lease: Duration,
    max_attempts: u32,
    backoff: Backoff,
}

impl Default for Relay {
    fn default() -> Self {
        Relay::new()
    }
}

impl Relay {
    /// 100 messages a round, 30 s leases, 10 refused attempts before a
    /// message is dead, retries after 1 s doubling up to 5 min.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::outbox::Relay::new(), inbox_runtime::outbox::Relay::default());
    /// ```
    pub fn new() -> Relay {
        Relay {
            batch_size: 100,
            lease: Duration::from_secs(30),
            max_attempts: 10,
            backoff: Backoff {
                first: Duration::from_secs(1),
                max: Duration::from_secs(300),
            },
        }
    }

    /// At most `size` messages a round, between 1 and [`MAX_RELAY_BATCH`]
    /// (clamped).
    ///
    /// ```
    /// let relay = inbox_runtime::outbox::Relay::new().batch_size(500);
    /// # let _ = relay;
    /// ```
    pub fn batch_size(mut self, size: u32) -> Relay {
        self.batch_size = size.clamp(1, MAX_RELAY_BATCH);
        self
    }

    /// How long a round holds its messages before another relay may take
    /// them over (at least 1 s). Longer than the publisher's longest wait
    /// for confirmations: a lease that runs out while its round still
    /// publishes lets a second relay publish the same messages (absorbed
    /// downstream by their id, but published twice).
    ///
    /// ```
    /// let relay = inbox_runtime::outbox::Relay::new().lease(std::time::Duration::from_secs(60));
    /// # let _ = relay;
    /// ```
    pub fn lease(mut self, lease: Duration) -> Relay {
        self.lease = lease.max(Duration::from_secs(1));
        self
    }

    /// How many refused publishes make a message dead (at least 1).
    ///
    /// ```
    /// let relay = inbox_runtime::outbox::Relay::new().max_attempts(3);
    /// # let _ = relay;
    /// ```
    pub fn max_attempts(mut self, attempts: u32) -> Relay {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The wait before a refused message is tried again, by its number of
    /// refused attempts.
    ///
    /// ```
    /// use std::time::Duration;
    /// let relay = inbox_runtime::outbox::Relay::new()
    ///     .backoff(inbox_runtime::Backoff { first: Duration::from_millis(100), max: Duration::from_secs(10) });
    /// # let _ = relay;
    /// ```
    pub fn backoff(mut self, backoff: Backoff) -> Relay {
        self.backoff = backoff;
        self
    }

    /// One round on a blocking connection, publishing through `publisher`
    /// (see [`Relay`]). Run it in a loop: at once again while rounds are
    /// full, after a pause when [`RelayReport::is_idle`], after a backoff
    /// when [`RelayReport::unavailable`] is not zero.
    ///
    /// Errors: [`InboxError::InsideTransaction`] when `conn` has a
    /// transaction open (a lease must commit on its own); database errors
    /// as [`InboxError::Database`] (see
    /// [`recovery`](crate::InboxError::recovery)). If marking fails after
    /// the broker confirmed, the messages stay leased and are published
    /// again, under the same ids, when the lease runs out.
    pub fn run_once<C, P>(&self, conn: &mut C, publisher: &mut P) -> Result<RelayReport, InboxError>
    where
        C: LoadConnection,
        C::Backend: InboxBackend,
        P: BlockingPublisher,
    {
        block_ready(round::round(
            self,
            &mut exec::Blocking::new(conn),
            &mut round::BlockingPublish(publisher),
        ))
    }

    /// [`run_once`](Self::run_once) on a diesel-async connection with an
    /// async [`Publisher`] (feature `async`). Dropping the future between
    /// the lease and the mark leaves the messages leased: they are
    /// published again when the lease runs out.
    #[cfg(feature = "async")]
    pub async fn run_once_async<C, P>(
        &self,
        conn: &mut C,
        publisher: &mut P,
    ) -> Result<RelayReport, InboxError>
    where
        C: diesel_async::AsyncConnection,
        C::Backend: InboxBackend,
        P: Publisher,
    {
        round::round(
            self,
            &mut exec::Async::new(conn),
            &mut round::AsyncPublish(publisher),
        )
        .await
    }
}

/// What one relay round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// Messages the round leased.
    pub leased: usize,
    /// Messages the broker confirmed, now marked sent.
    pub published: usize,
    /// Messages the broker refused (counted, to be retried or dead).
    pub refused: usize,
    /// Of the refused, those that reached the limit and are now dead.
    pub dead: usize,
    /// Messages the broker could not take, given back uncounted.
    pub unavailable: usize,
    /// What the publisher said of the last message it could not publish.
    pub last_unavailable: Option<String>,
}

impl std::fmt::Display for RelayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "leased {}, published {}", self.leased, self.published)?;
        if self.refused > 0 {
            write!(f, ", refused {} ({} now dead)", self.refused, self.dead)?;
        }
        if self.unavailable > 0 {
            write!(f, ", {} given back: broker unavailable", self.unavailable)?;
            if let Some(reason) = &self.last_unavailable {
                write!(f, " ({reason})")?;
            }
        }
        Ok(())
    }
}

impl RelayReport {
    /// `true` when the round found nothing to publish.
    ///
    /// ```
    /// assert!(inbox_runtime::outbox::RelayReport::default().is_idle());
    /// ```
    pub fn is_idle(&self) -> bool {
        self.leased == 0
    }
}

/// The statement that leases a round's messages on `B`, when it is one
/// statement (PostgreSQL's; MariaDB and SQLite lock, then lease): binds
/// `$1` the relay's owner id, `$2` the lease in milliseconds, `$3` the
/// batch size. For the suite's plan checks.
#[doc(hidden)]
pub fn lease_statement<B: InboxBackend>() -> Option<&'static str> {
    match B::OUTBOX_SQL.lease {
        crate::backend::Lease::Returning(sql) => Some(sql),
        crate::backend::Lease::LockThenLease { .. } => None,
    }
}
