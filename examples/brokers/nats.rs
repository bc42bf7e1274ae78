//! The ledger consumer on NATS JetStream, with async-nats.
//!
//! Per run `<run>` (`<RUN>` in capitals):
//!
//! | object | name | |
//! |---|---|---|
//! | stream | `LEDGER_<RUN>` | subject `ledger.<run>.payments`; work-queue retention (a message leaves when acknowledged or terminated); drops a re-publish of the same `Nats-Msg-Id` within [`BrokerConfig::duplicate_window`] |
//! | consumer | `ledger` | durable, pull, explicit acks, [`BrokerConfig::ack_wait`], [`BrokerConfig::max_deliver`] |
//! | stream | `LEDGER_<RUN>_DEAD` | the dead-letter stream: subject `ledger.<run>.dead`, and JetStream's advisories of messages that reached `max_deliver` |
//!
//! The producer publishes each payment with its id in the `Nats-Msg-Id`
//! header and waits for the stream's acknowledgement; a re-publish within
//! the duplicate window is acknowledged as a duplicate and not stored.
//!
//! The consumer pulls deliveries ([`BrokerConfig::prefetch`] at a time), runs
//! the handler on each, and only then settles it as
//! [`Verdict::decision`] says:
//!
//! - `Ack`: `+ACK`, and waits for the server to confirm it;
//! - `Retry`: `-NAK` with a delay from [`RETRY_BACKOFF`] and the delivery
//!   count: JetStream delivers it again after the delay;
//! - `RetryLater` (another delivery of the message is in flight): `-NAK`
//!   with [`BrokerConfig::in_progress_delay`](super::BrokerConfig::in_progress_delay), so the copy comes back after the first
//!   delivery has ended;
//! - `DeadLetter`: publishes the message to the dead-letter stream (with a
//!   `Nats-Msg-Id` of its own stream sequence, so that a second dead-letter
//!   of the same copy is dropped, and headers `Ledger-Message-Id` and
//!   `Ledger-Dead-Reason`), waits for the stream's acknowledgement, then
//!   `+TERM`: JetStream stops delivering it.
//!
//! A delivery that is not settled within `ack_wait` (its consumer died, or
//! is slow) is delivered again, to any consumer; after `max_deliver`
//! deliveries JetStream gives up on it, leaves it in the stream and
//! publishes an advisory, which the dead-letter stream keeps. The inbox
//! decides long before that: a poison message is dead after
//! [`MAX_ATTEMPTS`](super::ledger::MAX_ATTEMPTS) deliveries.

use std::future::Future;
use std::time::Duration;

use async_nats::header::NATS_MESSAGE_ID;
use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::{self, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, AckKind, Message};
use async_nats::HeaderMap;
use futures_util::StreamExt;
use inbox_runtime::AckDecision;

use super::delivery::{handle, Probe, Received, Verdict, RETRY_BACKOFF};
use super::ledger::Pool;
use super::{Backlog, BoxError, Broker, BrokerConfig, DeadCopy, DeadLetterQueue, Outgoing};

/// The default server URL: NATS on loopback.
pub const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

/// The header that carries a dead letter's payment id.
pub const MESSAGE_ID_HEADER: &str = "Ledger-Message-Id";

/// The header that says why a message was dead-lettered.
pub const REASON_HEADER: &str = "Ledger-Dead-Reason";

/// How long the dead-letter stream drops a second dead-letter of the same
/// copy (a consumer that died after publishing it and before `+TERM`).
const DEAD_LETTER_DUPLICATE_WINDOW: Duration = Duration::from_secs(600);

/// The names of a run's streams, subjects and consumer.
///
/// ```
/// let names = inbox_examples::brokers::nats::Names::of("demo");
/// assert_eq!(names.stream, "LEDGER_DEMO");
/// assert_eq!(names.subject, "ledger.demo.payments");
/// assert_eq!(names.advisories, "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.LEDGER_DEMO.ledger");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The payments stream.
    pub stream: String,
    /// The payments subject.
    pub subject: String,
    /// The durable consumer.
    pub consumer: String,
    /// The dead-letter stream.
    pub dead_letter_stream: String,
    /// The dead-letter subject.
    pub dead_letter_subject: String,
    /// The subject of JetStream's advisories for messages that reached
    /// `max_deliver` on the consumer.
    pub advisories: String,
}

impl Names {
    /// The names of run `run`.
    pub fn of(run: &str) -> Self {
        let stream = format!("LEDGER_{}", run.to_uppercase());
        let consumer = "ledger".to_owned();
        Names {
            subject: format!("ledger.{run}.payments"),
            dead_letter_stream: format!("{stream}_DEAD"),
            dead_letter_subject: format!("ledger.{run}.dead"),
            advisories: format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{consumer}"),
            stream,
            consumer,
        }
    }
}

/// A connection to NATS for one run.
pub struct Nats {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    names: Names,
    config: BrokerConfig,
}

/// The producer-assigned id of a delivery: its `Nats-Msg-Id` header, as
/// text. (async-nats' `HeaderValue` is a `MessageId` itself with
/// inbox-runtime's `async-nats` feature, so a handler may take the header's
/// value as its id; the consumer shared with RabbitMQ, `delivery::handle`,
/// takes the id as an owned `String` for both brokers.)
fn message_id(headers: Option<&HeaderMap>) -> Option<String> {
    headers?
        .get(NATS_MESSAGE_ID)
        .map(|id| id.as_str().to_owned())
}

impl Nats {
    async fn consumer(&self) -> Result<PullConsumer, BoxError> {
        let stream = self.jetstream.get_stream(&self.names.stream).await?;
        let consumer = stream.get_consumer(&self.names.consumer).await?;
        Ok(consumer)
    }

    /// One delivery: the handler, then the broker decision, then the ack,
    /// nak or dead-letter and term.
    async fn settle<P: Probe>(&self, message: Message, pool: &Pool, probe: &P) {
        let (delivered, sequence) = match message.info() {
            Ok(info) => (info.delivered, info.stream_sequence),
            Err(_) => (1, 0),
        };
        let id = message_id(message.headers.as_ref());
        probe.delivered(&Received {
            message_id: id.as_deref(),
            redelivered: delivered > 1,
        });
        let verdict = handle(pool, id.clone(), &message.payload, probe).await;
        probe.before_settle(id.as_deref(), &verdict).await;
        let told = match verdict.decision() {
            AckDecision::Ack => message.double_ack().await,
            AckDecision::Retry => {
                let failures = u32::try_from(delivered).unwrap_or(u32::MAX);
                let delay = RETRY_BACKOFF.after(failures);
                message.ack_with(AckKind::Nak(Some(delay))).await
            }
            AckDecision::RetryLater => {
                message
                    .ack_with(AckKind::Nak(Some(self.config.in_progress_delay)))
                    .await
            }
            AckDecision::DeadLetter => {
                match self
                    .dead_letter(&message, id.as_deref(), sequence, &verdict)
                    .await
                {
                    Ok(()) => message.double_ack_with(AckKind::Term).await,
                    Err(error) => Err(error),
                }
            }
        };
        let told = told.map_err(|error| error.to_string());
        probe.settled(
            id.as_deref(),
            &verdict,
            told.as_ref().map(|_| ()).map_err(String::as_str),
        );
    }

    /// Publishes `message` to the dead-letter stream and waits for the
    /// stream to store it.
    async fn dead_letter(
        &self,
        message: &Message,
        id: Option<&str>,
        sequence: u64,
        verdict: &Verdict,
    ) -> Result<(), BoxError> {
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, format!("{}-{sequence}", self.names.stream));
        if let Some(id) = id {
            headers.insert(MESSAGE_ID_HEADER, id);
        }
        let reason = verdict.to_string().replace(['\r', '\n'], " ");
        headers.insert(REASON_HEADER, reason);
        self.jetstream
            .publish_with_headers(
                self.names.dead_letter_subject.clone(),
                headers,
                message.payload.clone(),
            )
            .await?
            .await?;
        Ok(())
    }
}

impl Broker for Nats {
    const NAME: &'static str = "NATS JetStream";

    async fn declare(config: &BrokerConfig) -> Result<Self, BoxError> {
        let broker = Self::connect(config).await?;
        let names = &broker.names;
        let payments = broker
            .jetstream
            .get_or_create_stream(stream::Config {
                name: names.stream.clone(),
                subjects: vec![names.subject.clone()],
                retention: RetentionPolicy::WorkQueue,
                storage: StorageType::File,
                duplicate_window: config.duplicate_window,
                ..stream::Config::default()
            })
            .await?;
        broker
            .jetstream
            .get_or_create_stream(stream::Config {
                name: names.dead_letter_stream.clone(),
                subjects: vec![names.dead_letter_subject.clone(), names.advisories.clone()],
                retention: RetentionPolicy::Limits,
                storage: StorageType::File,
                duplicate_window: DEAD_LETTER_DUPLICATE_WINDOW,
                ..stream::Config::default()
            })
            .await?;
        payments
            .get_or_create_consumer(
                &names.consumer,
                PullConfig {
                    durable_name: Some(names.consumer.clone()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: config.ack_wait,
                    max_deliver: config.max_deliver,
                    filter_subject: names.subject.clone(),
                    ..PullConfig::default()
                },
            )
            .await?;
        Ok(broker)
    }

    async fn connect(config: &BrokerConfig) -> Result<Self, BoxError> {
        let client = async_nats::ConnectOptions::new()
            .name(format!("ledger {}", config.run))
            .connect(config.url.as_str())
            .await?;
        Ok(Nats {
            jetstream: jetstream::new(client.clone()),
            client,
            names: Names::of(&config.run),
            config: config.clone(),
        })
    }

    async fn publish(&self, batch: &[Outgoing]) -> Result<Vec<bool>, BoxError> {
        let mut acks = Vec::with_capacity(batch.len());
        for message in batch {
            let mut publish = PublishMessage::build().payload(message.body.clone().into());
            if let Some(id) = &message.id {
                publish = publish.message_id(id);
            }
            acks.push(
                self.jetstream
                    .send_publish(self.names.subject.clone(), publish)
                    .await?,
            );
        }
        let mut stored = Vec::with_capacity(acks.len());
        for ack in acks {
            stored.push(!ack.await?.duplicate);
        }
        Ok(stored)
    }

    async fn consume<P: Probe>(
        &self,
        _consumer: &str,
        pool: &Pool,
        probe: &P,
        stop: impl Future<Output = ()> + Send,
    ) -> Result<(), BoxError> {
        let prefetch = usize::from(self.config.prefetch);
        let messages = self
            .consumer()
            .await?
            .stream()
            .max_messages_per_batch(prefetch)
            .messages()
            .await?;
        probe.ready();
        let work = messages.for_each_concurrent(prefetch, |message| async {
            match message {
                Ok(message) => self.settle(message, pool, probe).await,
                // A missed heartbeat, a reconnect: the pull carries on.
                Err(error) => eprintln!("ledger consumer: {error}"),
            }
        });
        tokio::select! {
            () = work => Err("the JetStream pull ended".into()),
            // Deliveries pulled and not yet settled come again after
            // `ack_wait`.
            () = stop => Ok(()),
        }
    }

    async fn backlog(&self) -> Result<Backlog, BoxError> {
        let consumer = self.consumer().await?.get_info().await?;
        let mut stream = self.jetstream.get_stream(&self.names.stream).await?;
        let stored = stream.info().await?.state.messages;
        Ok(Backlog {
            waiting: consumer.num_pending,
            unacknowledged: Some(consumer.num_ack_pending as u64),
            stored: Some(stored),
        })
    }

    async fn dead_letters(&self) -> Result<DeadLetterQueue, BoxError> {
        let mut stream = self
            .jetstream
            .get_stream(&self.names.dead_letter_stream)
            .await?;
        let state = stream.info().await?.state.clone();
        let mut queue = DeadLetterQueue::default();
        if state.messages == 0 {
            return Ok(queue);
        }
        for sequence in state.first_sequence..=state.last_sequence {
            let message = stream.get_raw_message(sequence).await?;
            if message.subject.as_str() == self.names.advisories {
                queue.max_deliveries_advisories += 1;
            } else {
                let id = message
                    .headers
                    .get(MESSAGE_ID_HEADER)
                    .map(|id| id.as_str().to_owned());
                queue.copies.push(DeadCopy { message_id: id });
            }
        }
        Ok(queue)
    }

    async fn delete(self) -> Result<(), BoxError> {
        for stream in [&self.names.stream, &self.names.dead_letter_stream] {
            self.jetstream.delete_stream(stream).await?;
        }
        self.close().await
    }

    async fn close(self) -> Result<(), BoxError> {
        self.client.drain().await?;
        Ok(())
    }
}
