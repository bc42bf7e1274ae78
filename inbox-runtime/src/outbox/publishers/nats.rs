//! [`JetStreamPublisher`]: the relay's messages to NATS JetStream through
//! async-nats, each acknowledged by its stream.

use std::fmt;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use async_nats::jetstream::{self, context::PublishErrorKind};

use crate::outbox::publisher::{OutboxMessage, PublishError, Publisher};

/// A [`Publisher`] for NATS JetStream through async-nats (feature
/// `outbox-nats`).
///
/// Each message is published to the subject named by its
/// [`destination`](OutboxMessage::destination), with its headers and the
/// header `Nats-Msg-Id` set to its [`OutboxId`](crate::outbox::OutboxId):
/// JetStream drops a second publish of the id within the stream's
/// duplicate window (`duplicate_window`, two minutes by default), and past
/// it the consumer's inbox does (`#[idempotent(id = message.headers…)]`).
///
/// A round's messages are published together, then their acks awaited. `Ok`
/// for a message its stream acknowledged (a duplicate the stream dropped
/// too: it holds the first copy). No stream for the subject (no responders:
/// also seen for a moment while a stream elects a leader) and a message
/// over the server's size limit are [refused](PublishError::refused):
/// counted, retried with a backoff, dead after the relay's
/// `max_attempts`. No ack in time, a broken connection, too many acks
/// pending and the stream's other errors (insufficient resources, a full
/// store) are [unavailable](PublishError::unavailable): the messages come
/// back uncounted and the relay backs off. The async-nats client
/// reconnects on its own.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use inbox_runtime::outbox::JetStreamPublisher;
///
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let publisher = JetStreamPublisher::new(async_nats::jetstream::new(client));
/// // BackgroundRelay::new(Relay::new()).spawn_task(pool, publisher, |round| …);
/// # let _ = publisher;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct JetStreamPublisher {
    context: jetstream::Context,
}

impl JetStreamPublisher {
    /// A publisher through `context` (`async_nats::jetstream::new(client)`;
    /// its timeout bounds the wait for each ack).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), async_nats::ConnectError> {
    /// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
    /// let publisher = inbox_runtime::outbox::JetStreamPublisher::new(async_nats::jetstream::new(client));
    /// # let _ = publisher;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(context: jetstream::Context) -> JetStreamPublisher {
        JetStreamPublisher { context }
    }
}

impl fmt::Debug for JetStreamPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamPublisher").finish_non_exhaustive()
    }
}

impl Publisher for JetStreamPublisher {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut sent = Vec::with_capacity(messages.len());
        for message in messages {
            let publish = self.context.publish_with_headers(
                message.destination.clone(),
                headers(message),
                message.payload.clone().into(),
            );
            sent.push(publish.await);
        }
        // The acks awaited together: a stream that stops answering costs a
        // round one ack timeout, not one per message.
        let acked = futures_util::future::join_all(sent.into_iter().map(|publish| async {
            match publish {
                Ok(ack) => ack.await.map(|_| ()),
                Err(error) => Err(error),
            }
        }))
        .await;
        messages
            .iter()
            .zip(acked)
            .map(|(message, acked)| acked.map_err(|error| answer(message, &error)))
            .collect()
    }
}

/// The JetStream headers of `message`.
fn headers(message: &OutboxMessage) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &message.headers {
        headers.append(name.as_str(), value.as_str());
    }
    headers.insert(NATS_MESSAGE_ID, message.id.to_string().as_str());
    headers
}

/// What a failed publish of `message` means for the relay.
fn answer(message: &OutboxMessage, error: &jetstream::context::PublishError) -> PublishError {
    match error.kind() {
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending => PublishError::unavailable(error.to_string()),
        PublishErrorKind::StreamNotFound => PublishError::refused(format!(
            "no stream captures the subject `{}`",
            message.destination
        )),
        _ => PublishError::refused(format!("{error} (subject `{}`)", message.destination)),
    }
}
