//! What a relay hands to a broker: [`OutboxMessage`]s, through a
//! [`Publisher`] (async) or a [`BlockingPublisher`], answered per message.

use std::fmt;
use std::future::Future;

use super::id::OutboxId;

/// A committed outgoing message, as a relay hands it to a publisher.
///
/// Publish it under [`id`](Self::id) as the broker's message id (AMQP
/// `message_id`, JetStream `Nats-Msg-Id`, a Kafka header): a relay that
/// dies between the broker's confirmation and marking the message sent
/// publishes it again, and the id is what lets the consumer's inbox (or the
/// broker's own duplicate window) absorb the second copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// The message's id.
    pub id: OutboxId,
    /// Where it goes (see [`OutgoingMessage::new`](super::OutgoingMessage::new)).
    pub destination: String,
    /// Its ordering key, if it has one.
    pub ordering_key: Option<String>,
    /// Its headers, in the order they were added.
    pub headers: Vec<(String, String)>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// How many publishes of it the broker refused before this one.
    pub attempts: u32,
    /// When it was recorded: microseconds since the Unix epoch, by the
    /// database clock.
    pub created_micros: i64,
}

/// Why a publish did not go through.
///
/// ```
/// use inbox_runtime::outbox::PublishError;
///
/// let refused = PublishError::refused("NO_ROUTE: no queue bound to `receipts`");
/// assert!(refused.is_refused());
/// let down = PublishError::unavailable("connection reset");
/// assert!(!down.is_refused());
/// assert_eq!(down.to_string(), "broker unavailable: connection reset");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishError {
    refused: bool,
    reason: String,
}

impl PublishError {
    /// The broker refused this message (unroutable, no stream for the
    /// subject, too large, not authorized): the relay counts a failed
    /// attempt, tries again after a backoff, and after
    /// [`Relay::max_attempts`](super::Relay::max_attempts) marks it dead
    /// (see [`dead`](super::dead)). A dead keyed message holds back the
    /// later messages of its key until it is revived or discarded.
    ///
    /// ```
    /// assert!(inbox_runtime::outbox::PublishError::refused("unroutable").is_refused());
    /// ```
    pub fn refused(reason: impl Into<String>) -> PublishError {
        PublishError {
            refused: true,
            reason: reason.into(),
        }
    }

    /// The broker could not be reached or did not confirm (connection lost,
    /// timeout, negative acknowledgement): nothing is counted, the message
    /// stays pending and the relay backs off before its next round.
    ///
    /// ```
    /// assert!(!inbox_runtime::outbox::PublishError::unavailable("timeout").is_refused());
    /// ```
    pub fn unavailable(reason: impl Into<String>) -> PublishError {
        PublishError {
            refused: false,
            reason: reason.into(),
        }
    }

    /// `true` for [`refused`](Self::refused), `false` for
    /// [`unavailable`](Self::unavailable).
    ///
    /// ```
    /// assert!(!inbox_runtime::outbox::PublishError::unavailable("down").is_refused());
    /// ```
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    /// What the broker or client said.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::outbox::PublishError::refused("no stream").reason(), "no stream");
    /// ```
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.refused {
            "refused by the broker"
        } else {
            "broker unavailable"
        };
        write!(f, "{kind}: {}", self.reason)
    }
}

impl std::error::Error for PublishError {}

/// Publishes a relay's messages to a broker, asynchronously.
///
/// A relay calls [`publish`](Self::publish) with a round's messages (at
/// most one per ordering key, so their order among themselves does not
/// matter: publish them concurrently) and expects one answer per message,
/// in the same order: `Ok` only once the broker has *confirmed* the message
/// (a RabbitMQ publisher confirm of a `mandatory` publish that was not
/// returned, a JetStream publish ack, a Kafka delivery report). Anything
/// less can lose it: the relay marks an `Ok` message sent and never
/// publishes it again. A missing answer counts as
/// [`PublishError::unavailable`].
///
/// The relay drops the future of a publish that has not answered within
/// three quarters of its [lease](super::Relay::lease), answering its
/// messages unavailable: keep a publisher's state sound when its future is
/// dropped at an await (a connection or channel it may have left midway is
/// best replaced at the next publish, as `LapinPublisher` does).
///
/// Implementing it for another broker, Kafka with `rdkafka` for example:
/// send each message with `FutureProducer::send` to the topic
/// `message.destination`, with `message.ordering_key` as the record key
/// (Kafka then keeps the key's order within its partition), the headers
/// and `message.id` as record headers, and `enable.idempotence=true`; await
/// the delivery futures together and map each to `Ok(())`, a retriable
/// `KafkaError` to [`PublishError::unavailable`], and a permanent one
/// (unknown topic, record too large, authorization) to
/// [`PublishError::refused`].
///
/// ```
/// use inbox_runtime::outbox::{OutboxMessage, PublishError, Publisher};
///
/// /// Publishes nowhere, confirming everything (a test double).
/// struct Discard;
///
/// impl Publisher for Discard {
///     async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
///         messages.iter().map(|_| Ok(())).collect()
///     }
/// }
/// ```
pub trait Publisher: Send {
    /// Publishes `messages` and waits for the broker's confirmations: one
    /// answer per message, in order.
    fn publish(
        &mut self,
        messages: &[OutboxMessage],
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send;
}

/// Publishes a relay's messages to a broker from a blocking thread: the
/// same contract as [`Publisher`], answered before returning.
///
/// ```
/// use inbox_runtime::outbox::{BlockingPublisher, OutboxMessage, PublishError};
///
/// /// Collects what it is given (a test double).
/// #[derive(Default)]
/// struct Collect(Vec<OutboxMessage>);
///
/// impl BlockingPublisher for Collect {
///     fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
///         self.0.extend_from_slice(messages);
///         messages.iter().map(|_| Ok(())).collect()
///     }
/// }
/// ```
pub trait BlockingPublisher {
    /// Publishes `messages` and waits for the broker's confirmations: one
    /// answer per message, in order.
    fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>>;
}
