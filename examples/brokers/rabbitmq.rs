//! The ledger consumer on RabbitMQ, with lapin.
//!
//! Per run `<run>`:
//!
//! | object | name | |
//! |---|---|---|
//! | queue | `ledger.<run>.payments` | durable; `x-dead-letter-exchange` = the exchange below |
//! | exchange | `ledger.<run>.dead-letter` | fanout, durable |
//! | queue | `ledger.<run>.dead` | durable, bound to it: the dead-letter queue |
//!
//! The producer publishes persistent messages (`delivery_mode` 2) with the
//! payment's id as the AMQP `message_id`, `mandatory`, on a channel in
//! confirm mode: a publish counts once the broker confirmed it (and did not
//! return it as unroutable).
//!
//! The consumer takes deliveries with manual acknowledgements and a
//! prefetch of [`BrokerConfig::prefetch`], runs the handler on each, and
//! only then settles it as [`Verdict::decision`] says:
//!
//! - `Ack`: `basic.ack`;
//! - `Retry`: `basic.nack` with `requeue`, after [`RETRY_BACKOFF`] (failures
//!   in a row on this consumer): the message is delivered again, with
//!   `redelivered` set;
//! - `RetryLater` (another delivery of the message is in flight):
//!   `basic.nack` with `requeue` after [`BrokerConfig::in_progress_delay`](super::BrokerConfig::in_progress_delay): RabbitMQ has
//!   no delay of its own, and holding the copy (one prefetch slot, for a
//!   bounded time) needs no delay queue in the topology;
//! - `DeadLetter`: `basic.reject` without `requeue`: the broker moves the
//!   message to the dead-letter exchange, which routes it to the
//!   dead-letter queue (with an `x-death` header saying why).
//!
//! A consumer that dies before it settles a delivery loses nothing: the
//! broker delivers the message again when the connection closes.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use futures_util::StreamExt;
use inbox_runtime::AckDecision;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, BasicRejectOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use super::delivery::{handle, Probe, Received, Verdict, RETRY_BACKOFF};
use super::ledger::Pool;
use super::{Backlog, BoxError, Broker, BrokerConfig, DeadCopy, DeadLetterQueue, Outgoing};

/// The default broker URL: RabbitMQ on loopback, user `guest`.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The names of a run's queues and exchange.
///
/// ```
/// let names = inbox_examples::brokers::rabbitmq::Names::of("demo");
/// assert_eq!(names.queue, "ledger.demo.payments");
/// assert_eq!(names.dead_letter_queue, "ledger.demo.dead");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The payments queue.
    pub queue: String,
    /// The dead-letter exchange.
    pub dead_letter_exchange: String,
    /// The dead-letter queue.
    pub dead_letter_queue: String,
}

impl Names {
    /// The names of run `run`.
    pub fn of(run: &str) -> Self {
        Names {
            queue: format!("ledger.{run}.payments"),
            dead_letter_exchange: format!("ledger.{run}.dead-letter"),
            dead_letter_queue: format!("ledger.{run}.dead"),
        }
    }
}

/// A connection to RabbitMQ for one run, with a channel in confirm mode
/// for publishing.
pub struct RabbitMq {
    connection: Connection,
    channel: Channel,
    names: Names,
    prefetch: u16,
    in_progress_delay: Duration,
}

/// The producer-assigned id of a delivery: its AMQP `message_id` property,
/// as text. (lapin's `ShortString` is a `MessageId` itself with
/// inbox-runtime's `lapin` feature, so a handler may take
/// `id = delivery.properties.message_id()`; the consumer shared with NATS,
/// `delivery::handle`, takes the id as an owned `String` for both brokers.)
fn message_id(properties: &BasicProperties) -> Option<String> {
    properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str().to_owned())
}

impl Broker for RabbitMq {
    const NAME: &'static str = "RabbitMQ";

    async fn declare(config: &BrokerConfig) -> Result<Self, BoxError> {
        let broker = Self::connect(config).await?;
        let names = &broker.names;
        let channel = &broker.channel;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                names.dead_letter_exchange.as_str().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(
                names.dead_letter_queue.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                names.dead_letter_queue.as_str().into(),
                names.dead_letter_exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(names.dead_letter_exchange.as_str().into()),
        );
        channel
            .queue_declare(
                names.queue.as_str().into(),
                QueueDeclareOptions::durable(),
                arguments,
            )
            .await?;
        Ok(broker)
    }

    async fn connect(config: &BrokerConfig) -> Result<Self, BoxError> {
        let properties = ConnectionProperties::default()
            .with_connection_name(format!("ledger {}", config.run).into());
        let connection = Connection::connect(&config.url, properties).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(RabbitMq {
            connection,
            channel,
            names: Names::of(&config.run),
            prefetch: config.prefetch,
            in_progress_delay: config.in_progress_delay,
        })
    }

    async fn publish(&self, batch: &[Outgoing]) -> Result<Vec<bool>, BoxError> {
        let mut confirms = Vec::with_capacity(batch.len());
        for message in batch {
            let mut properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into());
            if let Some(id) = &message.id {
                properties = properties.with_message_id(id.as_str().into());
            }
            let confirm = self
                .channel
                .basic_publish(
                    "".into(),
                    self.names.queue.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &message.body,
                    properties,
                )
                .await?;
            confirms.push(confirm);
        }
        for confirm in confirms {
            let confirmation = confirm.await?;
            if !confirmation.is_ack() {
                return Err("RabbitMQ refused a publish (nack)".into());
            }
            if let Some(returned) = confirmation.take_message() {
                return Err(format!(
                    "RabbitMQ returned a publish as unroutable: {} {}",
                    returned.reply_code, returned.reply_text
                )
                .into());
            }
        }
        // RabbitMQ stores every copy: it does not deduplicate.
        Ok(vec![true; batch.len()])
    }

    async fn consume<P: Probe>(
        &self,
        consumer: &str,
        pool: &Pool,
        probe: &P,
        stop: impl Future<Output = ()> + Send,
    ) -> Result<(), BoxError> {
        let channel = self.connection.create_channel().await?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await?;
        let deliveries = channel
            .basic_consume(
                self.names.queue.as_str().into(),
                consumer.into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        probe.ready();
        let failures_in_a_row = AtomicU32::new(0);
        let failed: Mutex<Option<lapin::Error>> = Mutex::new(None);
        let work = deliveries.for_each_concurrent(usize::from(self.prefetch), |delivery| async {
            match delivery {
                Ok(delivery) => {
                    let pace = Pace {
                        failures_in_a_row: &failures_in_a_row,
                        in_progress_delay: self.in_progress_delay,
                    };
                    settle(delivery, pool, probe, pace).await
                }
                Err(error) => {
                    failed.lock().expect("not poisoned").get_or_insert(error);
                }
            }
        });
        let stopped = {
            let mut work = std::pin::pin!(work);
            let stopped = tokio::select! {
                () = &mut work => false,
                () = stop => true,
            };
            if stopped {
                // Deliveries the broker sent before the cancel arrive before
                // its cancel-ok: the stream yields them, then ends.
                channel
                    .basic_cancel(consumer.into(), BasicCancelOptions::default())
                    .await?;
                work.await;
                let _ = channel.close(200, "consumer stopped".into()).await;
            }
            stopped
        };
        match failed.into_inner().expect("not poisoned") {
            Some(error) => Err(error.into()),
            None if stopped => Ok(()),
            None => Err("RabbitMQ cancelled the consumer".into()),
        }
    }

    async fn backlog(&self) -> Result<Backlog, BoxError> {
        let queue = self
            .channel
            .queue_declare(
                self.names.queue.as_str().into(),
                QueueDeclareOptions::durable().passive(),
                FieldTable::default(),
            )
            .await?;
        Ok(Backlog {
            waiting: u64::from(queue.message_count()),
            unacknowledged: None,
            stored: None,
        })
    }

    async fn dead_letters(&self) -> Result<DeadLetterQueue, BoxError> {
        let mut queue = DeadLetterQueue::default();
        while let Some(message) = self
            .channel
            .basic_get(
                self.names.dead_letter_queue.as_str().into(),
                BasicGetOptions::default(),
            )
            .await?
        {
            queue.copies.push(DeadCopy {
                message_id: message_id(&message.delivery.properties),
            });
            message
                .delivery
                .acker
                .ack(BasicAckOptions::default())
                .await?;
        }
        Ok(queue)
    }

    async fn delete(self) -> Result<(), BoxError> {
        for queue in [&self.names.queue, &self.names.dead_letter_queue] {
            self.channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await?;
        }
        self.channel
            .exchange_delete(
                self.names.dead_letter_exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await?;
        self.close().await
    }

    async fn close(self) -> Result<(), BoxError> {
        self.connection.close(200, "bye".into()).await?;
        Ok(())
    }
}

/// One delivery: the handler, then the broker decision, then the ack,
/// nack or reject.
/// How long a consumer waits before it requeues a delivery.
#[derive(Clone, Copy)]
struct Pace<'a> {
    /// Retries in a row, for [`RETRY_BACKOFF`].
    failures_in_a_row: &'a AtomicU32,
    /// Before a copy answered "in progress" is requeued.
    in_progress_delay: Duration,
}

async fn settle<P: Probe>(delivery: Delivery, pool: &Pool, probe: &P, pace: Pace<'_>) {
    let Pace {
        failures_in_a_row,
        in_progress_delay,
    } = pace;
    let id = message_id(&delivery.properties);
    probe.delivered(&Received {
        message_id: id.as_deref(),
        redelivered: delivery.redelivered,
    });
    let verdict = handle(pool, id.clone(), &delivery.data, probe).await;
    probe.before_settle(id.as_deref(), &verdict).await;
    let told = match verdict.decision() {
        AckDecision::Ack => {
            failures_in_a_row.store(0, Ordering::Relaxed);
            delivery.acker.ack(BasicAckOptions::default()).await
        }
        AckDecision::Retry => {
            let failures = failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
            tokio::time::sleep(RETRY_BACKOFF.after(failures)).await;
            let requeue = BasicNackOptions {
                requeue: true,
                multiple: false,
            };
            delivery.acker.nack(requeue).await
        }
        AckDecision::RetryLater => {
            // RabbitMQ requeues at once: the consumer holds the copy for the
            // delay first (one prefetch slot, for a bounded time), which
            // needs no delay queue in the topology.
            tokio::time::sleep(in_progress_delay).await;
            let requeue = BasicNackOptions {
                requeue: true,
                multiple: false,
            };
            delivery.acker.nack(requeue).await
        }
        AckDecision::DeadLetter => {
            failures_in_a_row.store(0, Ordering::Relaxed);
            let dead_letter = BasicRejectOptions { requeue: false };
            delivery.acker.reject(dead_letter).await
        }
    };
    let told = match told {
        Ok(true) => Ok(()),
        Ok(false) => Err("the channel is closed: the broker delivers it again".to_owned()),
        Err(error) => Err(error.to_string()),
    };
    report(probe, id.as_deref(), &verdict, told);
}

fn report<P: Probe>(probe: &P, id: Option<&str>, verdict: &Verdict, told: Result<(), String>) {
    probe.settled(
        id,
        verdict,
        told.as_ref().map(|_| ()).map_err(String::as_str),
    );
}
