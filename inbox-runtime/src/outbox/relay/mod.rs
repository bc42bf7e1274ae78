//! The relay: publishes committed outgoing messages and deletes them (or
//! marks them sent) once the broker confirmed them.

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
/// 1. **leases** up to [`batch_size`](Self::batch_size) messages: the
///    oldest pending messages that no other relay holds, that are not
///    waiting for a retry, and that are the first unsent message of their
///    ordering key (so a round holds at most one message per key).
///    - On PostgreSQL the round locks them (`FOR UPDATE SKIP LOCKED`) in a
///      transaction it keeps open while it publishes, and the locks are the
///      lease: other relays skip the rows, nothing is written to take them,
///      and they are free again the moment the round ends or its
///      connection does. For that transaction only, the server is told to
///      end the session if it sits idle for longer than
///      [`lease`](Self::lease) (`idle_in_transaction_session_timeout`), so
///      a relay stalled mid-round gives its messages up after the lease.
///    - On MySQL/MariaDB (`FOR UPDATE SKIP LOCKED`) and SQLite, a short
///      transaction of its own writes the lease into the rows: it lasts
///      [`lease`](Self::lease), after which another relay may take the
///      messages over (the relay holding them was killed or stalled).
///
///    Either way several relays share the work and never lease the same
///    message at once;
/// 2. **publishes** them through the publisher, which answers once the
///    broker confirmed each one;
/// 3. **records** the answers: the confirmed ones are deleted (on
///    PostgreSQL by the lease itself, the others put back; elsewhere one
///    delete per round), or marked sent and kept for the pruner when the relay
///    [keeps sent messages](Self::keep_sent). A refused one
///    ([`PublishError::refused`](super::PublishError::refused)) counts a
///    failed attempt and waits for its retry by [`backoff`](Self::backoff);
///    at [`max_attempts`](Self::max_attempts) it is dead (see
///    [`dead`](super::dead)). One the broker could not take
///    ([`PublishError::unavailable`](super::PublishError::unavailable)) is
///    given back at once, uncounted: back off before the next round
///    ([`RelayReport::unavailable`]).
///
/// What it promises:
/// - **nothing lost**: a message is deleted (or marked sent) only after the
///   broker confirmed it; a relay killed at any point leaves its messages
///   pending (on MySQL/MariaDB and SQLite, leased until the lease runs
///   out);
/// - **at least once, with a stable id**: a relay killed between the
///   broker's confirmation and the record (or whose record fails) leaves
///   the message to be published again, under the same id, for the
///   consumer's inbox to absorb: at once on PostgreSQL, once the lease has
///   run out elsewhere. Without kills, a message is published once;
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
    keep_sent: bool,
    /// Whether the database refused this relay's put-back for good (see
    /// `round::put_back`); shared by its clones.
    put_back_refused: PutBackRefused,
}

/// A relay's memo that the database refused its put-back for good (a role
/// without `INSERT` on the outbox, a trigger of the application's that
/// rejects it): its rounds then hold their rows locked and delete what the
/// broker confirmed, which needs no insert. Not part of the relay's
/// configuration: relays compare equal whatever it holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct PutBackRefused(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl PutBackRefused {
    /// Whether the put-back was refused.
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes that the put-back was refused.
    pub(crate) fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl PartialEq for PutBackRefused {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for PutBackRefused {}

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
            keep_sent: false,
            put_back_refused: PutBackRefused::default(),
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
    /// them over (at least 1 s; on PostgreSQL, how long the round's
    /// transaction may sit idle before the server ends its session). Longer
    /// than the publisher's longest wait for confirmations: a lease that
    /// runs out while its round still publishes lets a second relay publish
    /// the same messages (absorbed downstream by their id, but published
    /// twice; on PostgreSQL the stalled round then fails with a database
    /// error and records nothing). So an async round's publish gets three
    /// quarters of the lease: the publish future of a
    /// [`Publisher`](super::Publisher) that has not answered by then (a
    /// broker connection that hangs, one the broker blocks in a resource
    /// alarm) is dropped, and the round's messages come back uncounted, as
    /// [unavailable](super::PublishError::unavailable), before another relay
    /// may take them (the round then records nothing; on PostgreSQL it
    /// still has to end its transaction before the server's idle limit, so
    /// keep the lease well above a round's own statements). Copies the
    /// dropped publish already handed to the broker may still arrive: they
    /// carry the messages' ids, like every second publish. A
    /// [`BlockingPublisher`] answers when it returns: bound its waits
    /// yourself, below that.
    ///
    /// ```
    /// let relay = inbox_runtime::outbox::Relay::new().lease(std::time::Duration::from_secs(60));
    /// # let _ = relay;
    /// ```
    pub fn lease(mut self, lease: Duration) -> Relay {
        self.lease = lease.max(Duration::from_secs(1));
        self
    }

    /// How long a round's publish may take: three quarters of the lease.
    pub(crate) fn publish_limit(&self) -> Duration {
        self.lease / 4 * 3
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

    /// Whether a message the broker confirmed is kept, marked with the time
    /// it was sent, for the pruner to delete once it is older than the
    /// [`RetentionPolicy`](crate::RetentionPolicy)'s default window, instead of deleted
    /// at once (the default). Kept messages are an audit trail of what was
    /// sent; they cost the relay an update per message (the mark: a new
    /// row version and its index entries) and the pruner a delete later,
    /// where the default costs one delete per round (on PostgreSQL none:
    /// the lease deletes what it picks).
    ///
    /// ```
    /// let relay = inbox_runtime::outbox::Relay::new().keep_sent(true);
    /// # let _ = relay;
    /// ```
    pub fn keep_sent(mut self, keep: bool) -> Relay {
        self.keep_sent = keep;
        self
    }

    /// One round on a blocking connection, publishing through `publisher`
    /// (see [`Relay`]). Run it in a loop: at once again while rounds are
    /// full, after a pause when [`RelayReport::is_idle`], after a backoff
    /// when [`RelayReport::unavailable`] is not zero.
    ///
    /// Errors: [`InboxError::InsideTransaction`] when `conn` has a
    /// transaction open (a round's transactions are its own); database
    /// errors as [`InboxError::Database`] (see
    /// [`recovery`](crate::InboxError::recovery)). If recording fails after
    /// the broker confirmed, the messages are published again, under the
    /// same ids: at once on PostgreSQL (the round's transaction rolled
    /// back), when the lease runs out elsewhere.
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
    /// the lease and the record leaves the messages to be published again:
    /// on PostgreSQL once the connection's open transaction is rolled back
    /// (diesel-async does so on the connection's next use, a pool on
    /// checkout) or the server ends it after the lease, elsewhere when the
    /// lease runs out. Runs on tokio, with its timer enabled (`#[tokio::main]`
    /// does; a runtime built by hand needs `enable_time`): the publish is
    /// bounded by three quarters of the [lease](Self::lease), and retries
    /// after a lock conflict wait.
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
    /// Messages the broker confirmed, now deleted (or marked sent).
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

/// The statement that locks a round's messages on `B` (and deletes them,
/// unless the relay keeps sent messages), when the round holds them in its
/// transaction (PostgreSQL's): binds `$1` the lease in milliseconds as
/// text, `$2` the batch size. For the suite's plan checks.
#[doc(hidden)]
pub fn lease_statement<B: InboxBackend>(keep_sent: bool) -> Option<&'static str> {
    match (B::OUTBOX_SQL.deleting_lease, &B::OUTBOX_SQL.lease) {
        (Some(deleting), _) if !keep_sent => Some(deleting.lease),
        (_, crate::backend::Lease::HeldLock(sql)) => Some(sql),
        (_, crate::backend::Lease::Returning(_) | crate::backend::Lease::LockThenWrite { .. }) => {
            None
        }
    }
}
