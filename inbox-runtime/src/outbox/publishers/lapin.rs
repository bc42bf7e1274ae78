//! [`LapinPublisher`]: the relay's messages to RabbitMQ (any AMQP 0-9-1
//! broker) through lapin, confirmed by the broker.

use std::collections::HashMap;
use std::fmt;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ErrorKind};

use crate::outbox::publisher::{OutboxMessage, PublishError, Publisher};

/// AMQP reply codes of a publish that refuse a message for good: the
/// exchange does not exist (404 NOT_FOUND), the user may not publish there
/// (403 ACCESS_REFUSED), the message is over the broker's size limit (406
/// PRECONDITION_FAILED).
const REFUSING_CODES: [u16; 3] = [404, 403, 406];

/// A [`Publisher`] for RabbitMQ (any AMQP 0-9-1 broker) through lapin
/// (feature `outbox-lapin`).
///
/// Each message is published to the publisher's exchange (the default
/// exchange, `""`, unless [`exchange`](Self::exchange) names another) with
/// its [`destination`](OutboxMessage::destination) as the routing key (on
/// the default exchange: the queue's name), persistent (delivery mode 2),
/// `mandatory`, with:
///
/// - `message_id`: the message's [`OutboxId`](crate::outbox::OutboxId),
///   for the consumer's inbox (`#[idempotent(id =
///   delivery.properties.message_id() …)]`);
/// - its headers as AMQP headers (long strings), `content-type` also as
///   the `content_type` property;
/// - `timestamp`: when it was recorded, in seconds.
///
/// A round's messages are published on one channel in confirm mode, then
/// their confirms awaited together. `Ok` only for a message the broker
/// acknowledged and did not return (returns are matched to messages by
/// `message_id`). A message returned as unroutable (no queue bound for its
/// routing key) is [refused](PublishError::refused): counted, retried, then
/// dead. A publish the broker answers by closing the channel (no such
/// exchange: 404, not allowed: 403, too large: 406) refuses the round's
/// first message to fail so; the channel's other pending messages come back
/// uncounted (the broker does not say which message it closed the channel
/// for). Anything else (no connection, a refused login, a channel or
/// connection closed under it, a negative acknowledgement: the broker
/// could not store it) is [unavailable](PublishError::unavailable): the
/// messages come back uncounted and the relay backs off. The publisher connects
/// when it first publishes and reconnects (a new connection, or a new
/// channel on the same one) in the round after one failed. A publish that
/// was dropped before it finished (the relay gives a publish three
/// quarters of its lease) leaves its connection in an unknown state: the
/// next publish opens a new one, unless the broker said it blocks that
/// connection (`connection.blocked`, a resource alarm: memory or disk).
/// Then, and for as long as the broker blocks it, a publish sends nothing
/// and answers unavailable at once, on the same connection.
///
/// ```no_run
/// # #[cfg(all(feature = "postgres", feature = "r2d2"))]
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use inbox_runtime::outbox::{BackgroundRelay, LapinPublisher, Relay};
///
/// let publisher = LapinPublisher::new("amqp://127.0.0.1:5672/%2f", lapin::ConnectionProperties::default())
///     .exchange("billing");
/// // Through a deadpool pool of diesel-async connections (feature `tokio`):
/// // BackgroundRelay::new(Relay::new()).spawn_task(pool, publisher, |round| …);
/// # let _ = publisher;
/// # Ok(())
/// # }
/// ```
pub struct LapinPublisher {
    uri: String,
    properties: ConnectionProperties,
    exchange: String,
    connection: Option<Connection>,
    channel: Option<Channel>,
    /// A publish began and has not finished: when the next one begins, it
    /// was dropped midway.
    publishing: bool,
}

impl LapinPublisher {
    /// A publisher to the broker at `uri` (an `amqp://` or `amqps://` URL),
    /// connecting with `properties` (lapin's: on lapin 3.x they name the
    /// executor and reactor to run on) when it first publishes.
    ///
    /// ```
    /// let publisher = inbox_runtime::outbox::LapinPublisher::new(
    ///     "amqp://127.0.0.1:5672/%2f",
    ///     lapin::ConnectionProperties::default(),
    /// );
    /// # let _ = publisher;
    /// ```
    pub fn new(uri: impl Into<String>, properties: ConnectionProperties) -> LapinPublisher {
        LapinPublisher {
            uri: uri.into(),
            properties,
            exchange: String::new(),
            connection: None,
            channel: None,
            publishing: false,
        }
    }

    /// Publishes to `exchange` (the routing key is the message's
    /// destination) instead of the default exchange. The exchange must
    /// exist: a publish to a missing one is refused.
    ///
    /// ```
    /// let publisher = inbox_runtime::outbox::LapinPublisher::new(
    ///     "amqp://127.0.0.1:5672/%2f",
    ///     lapin::ConnectionProperties::default(),
    /// )
    /// .exchange("billing.events");
    /// # let _ = publisher;
    /// ```
    pub fn exchange(mut self, exchange: impl Into<String>) -> LapinPublisher {
        self.exchange = exchange.into();
        self
    }

    /// The channel to publish on: the open one, or a new one in confirm
    /// mode (on a new connection if the last one is gone).
    async fn channel(&mut self) -> Result<Channel, lapin::Error> {
        if let Some(channel) = self.channel.as_ref().filter(|c| c.status().connected()) {
            return Ok(channel.clone());
        }
        self.channel = None;
        let connection = match self.connection.take().filter(|c| c.status().connected()) {
            Some(connection) => connection,
            None => Connection::connect(&self.uri, self.properties.clone()).await?,
        };
        let channel = connection.create_channel().await;
        self.connection = Some(connection);
        let channel = channel?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        self.channel = Some(channel.clone());
        Ok(channel)
    }

    /// The answer for a publish that failed with `error`, `blamed` when it
    /// is the first of the round to fail so: the channel is given up (the
    /// next round opens another). A channel error fails every publish
    /// pending on the channel, whichever message caused it, so only the
    /// first is refused (counted); the others are given back uncounted and
    /// go again in the next round.
    fn failed(&mut self, error: &lapin::Error, blamed: &mut bool) -> PublishError {
        self.channel = None;
        match error.kind() {
            ErrorKind::ProtocolError(amqp)
                if REFUSING_CODES.contains(&amqp.get_id()) && !*blamed =>
            {
                *blamed = true;
                PublishError::refused(format!("{amqp} (exchange `{}`)", self.exchange))
            }
            _ => PublishError::unavailable(error.to_string()),
        }
    }
}

impl fmt::Debug for LapinPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LapinPublisher")
            .field("exchange", &self.exchange)
            .field("connected", &self.channel.is_some())
            .finish_non_exhaustive()
    }
}

impl Publisher for LapinPublisher {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let abandoned = std::mem::replace(&mut self.publishing, true);
        if self
            .connection
            .as_ref()
            .is_some_and(|c| c.status().blocked())
        {
            // A resource alarm: the broker takes no publish on any
            // connection until it clears. Kept, not replaced: a new
            // connection would be blocked too, and stay open.
            self.publishing = false;
            let answer = PublishError::unavailable(
                "RabbitMQ blocks this connection's publishes (a resource alarm): nothing sent",
            );
            return messages.iter().map(|_| Err(answer.clone())).collect();
        }
        if abandoned {
            // The last publish was dropped midway, on a connection the
            // broker did not say it blocks: it may hang, and its confirms
            // may still come.
            self.channel = None;
            self.connection = None;
        }
        let answers = self.publish_on_channel(messages).await;
        self.publishing = false;
        answers
    }
}

impl LapinPublisher {
    /// [`Publisher::publish`], once an abandoned connection is dropped.
    async fn publish_on_channel(
        &mut self,
        messages: &[OutboxMessage],
    ) -> Vec<Result<(), PublishError>> {
        let channel = match self.channel().await {
            Ok(channel) => channel,
            // No connection or channel: the broker's trouble, never the
            // messages' (a refused login included).
            Err(error) => {
                self.channel = None;
                let answer = PublishError::unavailable(error.to_string());
                return messages.iter().map(|_| Err(answer.clone())).collect();
            }
        };
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let mut sent = Vec::with_capacity(messages.len());
        for message in messages {
            let publish = channel.basic_publish(
                self.exchange.as_str().into(),
                message.destination.as_str().into(),
                options,
                &message.payload,
                properties(message),
            );
            sent.push(publish.await);
        }
        // lapin hands a returned message to whichever confirm completes
        // next (a `multiple` ack covers several): the returns are matched
        // to the round's messages by their `message_id`, not by the confirm
        // they came with.
        let mut answers = Vec::with_capacity(messages.len());
        let mut returned: HashMap<String, (u16, String)> = HashMap::new();
        let mut blamed = false;
        for publish in sent {
            let answer = match publish {
                Ok(confirm) => match confirm.await {
                    Ok(confirmation) => {
                        let nacked = confirmation.is_nack();
                        if let Some(message) = confirmation.take_message() {
                            if let Some(id) = message.delivery.properties.message_id() {
                                returned.insert(
                                    id.to_string(),
                                    (message.reply_code, message.reply_text.to_string()),
                                );
                            }
                        }
                        if nacked {
                            Err(PublishError::unavailable(
                                "negatively acknowledged: the broker could not take it",
                            ))
                        } else {
                            Ok(())
                        }
                    }
                    Err(error) => Err(self.failed(&error, &mut blamed)),
                },
                Err(error) => Err(self.failed(&error, &mut blamed)),
            };
            answers.push(answer);
        }
        for (message, answer) in messages.iter().zip(&mut answers) {
            if let Some((code, text)) = returned.get(message.id.as_str()) {
                *answer = Err(PublishError::refused(format!(
                    "returned {code} {text}: no queue bound for routing key `{}` on exchange `{}`",
                    message.destination, self.exchange
                )));
            }
        }
        answers
    }
}

/// The AMQP properties of `message`.
fn properties(message: &OutboxMessage) -> BasicProperties {
    let mut headers = FieldTable::default();
    let mut content_type = None;
    for (name, value) in &message.headers {
        if name.eq_ignore_ascii_case("content-type") {
            content_type = Some(value.as_str());
        }
        headers.insert(
            ShortString::from(name.as_str()),
            AMQPValue::LongString(LongString::from(value.as_str())),
        );
    }
    let mut properties = BasicProperties::default()
        .with_message_id(ShortString::from(message.id.to_string()))
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(message.created_micros / 1_000_000).unwrap_or(0))
        .with_headers(headers);
    if let Some(content_type) = content_type {
        properties = properties.with_content_type(ShortString::from(content_type));
    }
    properties
}
