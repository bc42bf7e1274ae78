//! A ledger consumer on real brokers: RabbitMQ ([`rabbitmq`], lapin) and
//! NATS JetStream ([`nats`], async-nats), with its effects in PostgreSQL
//! (feature `brokers`).
//!
//! One payment consumer, written once ([`ledger`], [`delivery`]), behind
//! two brokers that deliver at least once:
//!
//! 1. the producer assigns every payment a stable id and publishes it with
//!    publisher confirms (AMQP `message_id`; JetStream `Nats-Msg-Id`), and
//!    publishes some of them again, as a producer does after a timeout;
//! 2. a consumer receives a delivery, takes the id from the broker's
//!    metadata, and runs [`ledger::apply_payment`], an `#[idempotent]` async
//!    handler: one PostgreSQL transaction claims the id in the inbox, adds
//!    the amount to the account's balance and writes a ledger entry;
//! 3. **only after the handler has returned** does it tell the broker, as
//!    [`inbox_runtime::ack_decision`] says: ack (applied now, or a
//!    duplicate), redeliver (nothing was committed), or dead-letter (a
//!    rejection, exhausted attempts, a message without an id). A crash
//!    anywhere in between costs a redelivery, which the inbox turns into a
//!    duplicate: each payment moves money exactly once.
//!
//! [`Broker`] is what the two brokers have in common; [`plan`] is the
//! producer's side (which payments, which poison, which retries), and
//! [`check`] proves a run: every good payment applied exactly once, every
//! poison message dead-lettered, nothing left in the queue. [`run`] is the
//! driver of the `rabbitmq` and `nats` examples; the chaos tests of
//! `inbox-tests` (`tests/brokers/`) run the same consumer in processes they
//! kill.

pub mod check;
pub mod delivery;
pub mod ledger;
pub mod nats;
pub mod plan;
pub mod rabbitmq;
pub mod run;

use std::future::Future;
use std::time::Duration;

use crate::brokers::delivery::Probe;
use crate::brokers::ledger::Pool;

/// Any error of the broker clients or of the database setup.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a run's broker objects are named after, and how the consumer side
/// is tuned.
///
/// ```
/// use inbox_examples::brokers::BrokerConfig;
/// let config = BrokerConfig::new("amqp://127.0.0.1:5672/%2f", "ledger_demo");
/// assert_eq!(config.prefetch, 8);
/// ```
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The broker's URL (`amqp://…`, `nats://…`).
    pub url: String,
    /// The run's name: every queue, exchange, stream and subject of the run
    /// carries it, so that runs never see each other's messages. Lowercase
    /// letters, digits and `_`.
    pub run: String,
    /// How many deliveries one consumer works on at once (AMQP prefetch,
    /// JetStream pull batch), and the size of its connection pool.
    pub prefetch: u16,
    /// JetStream: how long a delivery may stay unacknowledged before it is
    /// redelivered (to any consumer).
    pub ack_wait: Duration,
    /// JetStream: how many deliveries a message gets before JetStream gives
    /// up on it. Well above [`ledger::MAX_ATTEMPTS`]: the inbox, not the
    /// broker, decides when a message is dead; a message that reaches this
    /// is reported by an advisory that the dead-letter stream keeps.
    pub max_deliver: i64,
    /// JetStream: how long the stream drops a re-publish with the same
    /// `Nats-Msg-Id` by itself.
    pub duplicate_window: Duration,
    /// How long a copy answered "in progress" (another delivery of the
    /// message is still running) waits before the broker delivers it again:
    /// [`delivery::IN_PROGRESS_DELAY`] by default.
    pub in_progress_delay: Duration,
}

impl BrokerConfig {
    /// The defaults for `url` and `run`: a prefetch of 8, `ack_wait` 5 s,
    /// `max_deliver` 20, a duplicate window of 2 s (short, so that the
    /// examples show in seconds a producer retry that comes after the
    /// window, which in production is a retry after minutes).
    pub fn new(url: impl Into<String>, run: impl Into<String>) -> Self {
        BrokerConfig {
            url: url.into(),
            run: run.into(),
            prefetch: 8,
            ack_wait: Duration::from_secs(5),
            max_deliver: 20,
            duplicate_window: Duration::from_secs(2),
            in_progress_delay: delivery::IN_PROGRESS_DELAY,
        }
    }
}

/// One message as the producer publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The producer-assigned id (`None`: a faulty producer that forgot it).
    pub id: Option<String>,
    /// The payload (JSON, see [`ledger::PaymentBody`]).
    pub body: Vec<u8>,
}

/// What is waiting in a run's queue.
///
/// ```
/// use inbox_examples::brokers::Backlog;
/// let empty = Backlog { waiting: 0, unacknowledged: Some(0), stored: Some(0) };
/// assert!(empty.is_settled());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    /// Messages waiting for a consumer (AMQP ready; JetStream pending).
    pub waiting: u64,
    /// Delivered and not yet acknowledged, where the broker says
    /// (JetStream; AMQP does not).
    pub unacknowledged: Option<u64>,
    /// Messages the stream still stores (JetStream work queue: neither
    /// acknowledged nor terminated).
    pub stored: Option<u64>,
}

impl Backlog {
    /// Nothing waiting, nothing unacknowledged (as far as the broker says),
    /// nothing stored.
    pub fn is_settled(&self) -> bool {
        self.waiting == 0 && self.unacknowledged.unwrap_or(0) == 0 && self.stored.unwrap_or(0) == 0
    }
}

/// One message in a run's dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadCopy {
    /// The id it was published with, if any.
    pub message_id: Option<String>,
}

/// A run's dead-letter queue, read to the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterQueue {
    /// The dead-lettered messages, one per copy the broker stored.
    pub copies: Vec<DeadCopy>,
    /// JetStream: advisories of messages that reached `max_deliver` (none
    /// expected; always 0 on RabbitMQ).
    pub max_deliveries_advisories: u64,
}

/// A broker, as the ledger consumer, the producer and the checks use it.
///
/// The consumer side is [`consume`](Broker::consume): it receives
/// deliveries, runs [`delivery::handle`] on each (the handler, then the
/// broker decision), and only then acknowledges, redelivers or
/// dead-letters the delivery.
pub trait Broker: Sized + Send + Sync + 'static {
    /// The broker's name, for messages.
    const NAME: &'static str;

    /// Connects and declares the run's queues or streams (idempotent).
    fn declare(config: &BrokerConfig) -> impl Future<Output = Result<Self, BoxError>> + Send;

    /// Connects to a run whose queues or streams are declared.
    fn connect(config: &BrokerConfig) -> impl Future<Output = Result<Self, BoxError>> + Send;

    /// Publishes `batch`, waiting for the broker's confirmation of each
    /// message. Returns, per message, whether the broker stored it (`false`:
    /// the broker dropped it as a duplicate of an earlier publish).
    fn publish(
        &self,
        batch: &[Outgoing],
    ) -> impl Future<Output = Result<Vec<bool>, BoxError>> + Send;

    /// Consumes the run's payments until `stop` completes, then stops
    /// taking deliveries, settles those it holds and returns. Returns an
    /// error when the broker connection fails.
    fn consume<P: Probe>(
        &self,
        consumer: &str,
        pool: &Pool,
        probe: &P,
        stop: impl Future<Output = ()> + Send,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// What is waiting in the run's queue.
    fn backlog(&self) -> impl Future<Output = Result<Backlog, BoxError>> + Send;

    /// Reads the run's dead-letter queue (RabbitMQ: takes its messages).
    fn dead_letters(&self) -> impl Future<Output = Result<DeadLetterQueue, BoxError>> + Send;

    /// Deletes the run's queues or streams and closes the connection.
    fn delete(self) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Closes the connection, leaving the run's queues or streams.
    fn close(self) -> impl Future<Output = Result<(), BoxError>> + Send;
}
