//! The runtime's publishers against the real brokers: `LapinPublisher` on
//! RabbitMQ and `JetStreamPublisher` on NATS JetStream, each driven by a
//! relay over PostgreSQL. What reaches the broker (the outbox id as the
//! message id, headers, persistence), what a refusal is (unroutable, no
//! exchange, no stream: counted, then dead), what an unreachable broker is
//! (uncounted), a channel the broker closed reopened in the next round, and
//! a second publish of an id dropped by JetStream's duplicate window.
//!
//! Needs RabbitMQ (`INBOX_TEST_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`) and NATS with JetStream
//! (`INBOX_TEST_NATS_URL`, default `nats://127.0.0.1:4222`); an unreachable
//! broker skips the test, or fails it with `INBOX_TEST_REQUIRE_BROKERS=1`.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use diesel_async::AsyncConnection;
use inbox_runtime::outbox::{
    self, JetStreamPublisher, LapinPublisher, OutboxMessage, OutgoingMessage, PublishError,
    Publisher, Relay,
};
use inbox_runtime::{Backoff, InboxBackend};
use inbox_tests::proxy::Proxy;
use inbox_tests::{AsyncSqlRows, TestBackend};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};

inbox_tests::backend_tests!(
    async only [postgres]:
    rabbitmq_gets_confirmed_messages_and_refuses_unroutable_ones,
    rabbitmq_refuses_a_missing_exchange_and_the_publisher_reopens_its_channel,
    jetstream_gets_each_id_once_and_refuses_a_subject_without_stream,
    a_full_jetstream_stream_is_unavailable_and_a_message_it_can_never_take_refused,
    an_unreachable_broker_is_unavailable_not_refused,
    a_stalled_broker_connection_holds_a_round_no_longer_than_its_lease,
    a_connection_rabbitmq_blocks_is_kept_and_answered_unavailable_at_once,
);

fn amqp_url() -> String {
    std::env::var("INBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

fn nats_url() -> String {
    std::env::var("INBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A name of this run's own (queues, exchanges, streams).
fn run_name(what: &str) -> String {
    format!("outbox-{what}-{}", uuid::Uuid::new_v4().simple())
}

async fn rabbitmq() -> Option<Connection> {
    match Connection::connect(&amqp_url(), ConnectionProperties::default()).await {
        Ok(connection) => Some(connection),
        Err(error) => {
            inbox_tests::report_unavailable_broker("RabbitMQ", &amqp_url(), &error);
            None
        }
    }
}

async fn nats() -> Option<async_nats::Client> {
    match async_nats::connect(nats_url()).await {
        Ok(client) => Some(client),
        Err(error) => {
            inbox_tests::report_unavailable_broker("NATS", &nats_url(), &error);
            None
        }
    }
}

/// Records `messages` in one transaction.
async fn send_all<C>(conn: &mut C, messages: &[OutgoingMessage]) -> Vec<String>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    conn.transaction(async |conn| {
        let mut ids = Vec::new();
        for message in messages {
            ids.push(outbox::send_async(conn, message).await?.to_string());
        }
        Ok::<_, inbox_runtime::InboxError>(ids)
    })
    .await
    .unwrap()
}

/// Declares the queue `name` (a run's own, see [`run_name`]).
async fn declare_queue(channel: &lapin::Channel, name: &str) {
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
}

/// Retries come due at once, and the second refusal is the last.
fn impatient_relay() -> Relay {
    Relay::new().max_attempts(2).backoff(Backoff {
        first: Duration::from_millis(1),
        max: Duration::from_millis(1),
    })
}

pub async fn rabbitmq_gets_confirmed_messages_and_refuses_unroutable_ones<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let Some(amqp) = rabbitmq().await else { return };
    let channel = amqp.create_channel().await.unwrap();
    let queue = run_name("receipts");
    declare_queue(&channel, &queue).await;
    let unroutable = run_name("nobody-listens");
    let mut conn = db.connect_async().await;
    let ids = send_all(
        &mut conn,
        &[
            OutgoingMessage::new(queue.clone(), "receipt p-1")
                .ordering_key("account-1")
                .header("content-type", "text/plain")
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                ),
            OutgoingMessage::new(unroutable.clone(), "lost?"),
        ],
    )
    .await;
    let mut publisher = LapinPublisher::new(amqp_url(), ConnectionProperties::default());
    let relay = impatient_relay();

    let first = relay
        .run_once_async(&mut conn, &mut publisher)
        .await
        .unwrap();
    assert_eq!(
        (first.published, first.refused, first.dead),
        (1, 1, 0),
        "{first}"
    );
    let got = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the confirmed message is in its queue");
    let sent_id = ids[0].clone();
    let properties = &got.delivery.properties;
    assert_eq!(
        properties.message_id().as_ref().map(|id| id.as_str()),
        Some(sent_id.as_str()),
        "published under its outbox id"
    );
    assert_eq!(properties.delivery_mode(), &Some(2), "persistent");
    assert_eq!(
        properties.content_type().as_ref().map(|t| t.as_str()),
        Some("text/plain")
    );
    let headers = properties.headers().as_ref().expect("headers");
    let traceparent = headers.inner().get("traceparent");
    assert!(
        matches!(traceparent, Some(AMQPValue::LongString(value)) if value.to_string().starts_with("00-4bf92f")),
        "{traceparent:?}"
    );
    assert_eq!(got.delivery.data, b"receipt p-1");

    // The unroutable message again, once its retry is due: dead.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = relay
        .run_once_async(&mut conn, &mut publisher)
        .await
        .unwrap();
    assert_eq!((second.refused, second.dead), (1, 1), "{second}");
    let dead = outbox::dead(&mut db.connect(), 0, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].destination, unroutable);
    assert!(
        dead[0].last_error.contains("NO_ROUTE"),
        "{}",
        dead[0].last_error
    );
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}

pub async fn rabbitmq_refuses_a_missing_exchange_and_the_publisher_reopens_its_channel<
    B: TestBackend,
>() {
    let Some(db) = B::open() else { return };
    let Some(amqp) = rabbitmq().await else { return };
    let exchange = run_name("events");
    let queue = run_name("audit");
    let mut conn = db.connect_async().await;
    send_all(&mut conn, &[OutgoingMessage::new("audit", "one")]).await;
    let mut publisher =
        LapinPublisher::new(amqp_url(), ConnectionProperties::default()).exchange(exchange.clone());
    let relay = impatient_relay().max_attempts(10);

    let refused = relay
        .run_once_async(&mut conn, &mut publisher)
        .await
        .unwrap();
    assert_eq!((refused.published, refused.refused), (0, 1), "{refused}");
    let attempts = conn
        .bigint("SELECT CAST(attempts AS BIGINT) AS value FROM inbox_outbox")
        .await;
    assert_eq!(attempts, 1, "a missing exchange counts an attempt");

    // The exchange appears; the broker closed the publisher's channel on the
    // 404, and the next round opens another.
    let channel = amqp.create_channel().await.unwrap();
    channel
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    declare_queue(&channel, &queue).await;
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "audit".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let published = relay
        .run_once_async(&mut conn, &mut publisher)
        .await
        .unwrap();
    assert_eq!(published.published, 1, "{published}");
    let got = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("routed through the exchange by its destination");
    assert_eq!(got.delivery.data, b"one");
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}

pub async fn jetstream_gets_each_id_once_and_refuses_a_subject_without_stream<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let Some(client) = nats().await else { return };
    let js = jetstream::new(client);
    let name = run_name("receipts");
    let subject = format!("{name}.receipts");
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    let nowhere = format!("{}.lost", run_name("nostream"));
    let mut conn = db.connect_async().await;
    send_all(
        &mut conn,
        &[
            OutgoingMessage::new(subject.clone(), "r-1").header("traceparent", "00-abc-def-01"),
            OutgoingMessage::new(subject.clone(), "r-2"),
            OutgoingMessage::new(nowhere.clone(), "lost?"),
        ],
    )
    .await;
    let mut publisher = Recording {
        inner: JetStreamPublisher::new(js.clone()),
        seen: Vec::new(),
    };
    let relay = impatient_relay();

    let report = relay
        .run_once_async(&mut conn, &mut publisher)
        .await
        .unwrap();
    assert_eq!((report.published, report.refused), (2, 1), "{report}");
    let first = stream.get_raw_message(1).await.unwrap();
    let published = publisher
        .seen
        .iter()
        .find(|m| m.payload == first.payload.as_ref())
        .expect("the stream's first message went through the publisher");
    assert_eq!(
        first.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some(published.id.to_string().as_str()),
        "published under its outbox id"
    );
    assert_eq!(
        first.headers.get("traceparent").map(|v| v.as_str()),
        Some("00-abc-def-01")
    );

    // A relay that dies between the ack and its mark publishes again under
    // the same id: JetStream's duplicate window drops the copy.
    let copies: Vec<OutboxMessage> = (publisher.seen.iter())
        .filter(|m| m.destination == subject)
        .cloned()
        .collect();
    assert_eq!(copies.len(), 2);
    let answers = publisher.inner.publish(&copies).await;
    assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    let state = js
        .get_stream(&name)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .state;
    assert_eq!(state.messages, 2, "each id once in the stream");

    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = relay
        .run_once_async(&mut conn, &mut publisher)
        .await
        .unwrap();
    assert_eq!((second.refused, second.dead), (1, 1), "{second}");
    let dead = outbox::dead(&mut db.connect(), 0, 10).unwrap();
    assert_eq!(dead[0].destination, nowhere);
    assert!(
        dead[0].last_error.contains("no stream"),
        "{}",
        dead[0].last_error
    );
    js.delete_stream(&name).await.unwrap();
}

/// What JetStream's own answers mean: a stream that is full (its limits
/// reached, discarding new messages) takes the message later, once its
/// consumers catch up: unavailable, given back uncounted. A message over
/// the stream's size limit, and a destination that is no subject at all,
/// can never go: refused, counted towards dead.
pub async fn a_full_jetstream_stream_is_unavailable_and_a_message_it_can_never_take_refused<
    B: TestBackend,
>() {
    let Some(db) = B::open() else { return };
    let Some(client) = nats().await else { return };
    let js = jetstream::new(client);
    let name = run_name("full");
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        max_messages: 1,
        max_message_size: 256,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await
    .unwrap();
    let subject = format!("{name}.receipts");
    let mut conn = db.connect_async().await;
    send_all(
        &mut conn,
        &[
            OutgoingMessage::new(subject.clone(), "first"),
            OutgoingMessage::new(subject.clone(), "second"),
            OutgoingMessage::new(subject.clone(), vec![b'x'; 1000]),
            OutgoingMessage::new("not a subject", "spaces"),
        ],
    )
    .await;
    let mut publisher = Answers {
        inner: JetStreamPublisher::new(js.clone()),
        answers: Vec::new(),
    };
    let report = impatient_relay()
        .run_once_async(&mut conn, &mut publisher)
        .await
        .unwrap();
    let by_payload: Vec<(&[u8], &Result<(), PublishError>)> = publisher
        .answers
        .iter()
        .map(|(message, answer)| (&message.payload[..3], answer))
        .collect();
    assert!(matches!(by_payload[0], (b"fir", Ok(()))), "{by_payload:?}");
    assert!(
        matches!(by_payload[1], (b"sec", Err(full)) if !full.is_refused()),
        "a full stream is unavailable: {by_payload:?}"
    );
    assert!(
        matches!(by_payload[2], (b"xxx", Err(too_big)) if too_big.is_refused()),
        "over the stream's size limit is refused: {by_payload:?}"
    );
    assert!(
        matches!(by_payload[3], (b"spa", Err(no_subject)) if no_subject.is_refused()),
        "not a subject is refused: {by_payload:?}"
    );
    assert_eq!(
        (report.published, report.refused, report.unavailable),
        (1, 2, 1),
        "{report}"
    );
    js.delete_stream(&name).await.unwrap();
}

/// Forwards to `inner`, keeping each message with its answer.
struct Answers<P> {
    inner: P,
    answers: Vec<(OutboxMessage, Result<(), PublishError>)>,
}

impl<P: Publisher> Publisher for Answers<P> {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let answers = self.inner.publish(messages).await;
        self.answers
            .extend(messages.iter().cloned().zip(answers.iter().cloned()));
        answers
    }
}

/// Forwards to `inner`, keeping what it was given.
struct Recording<P> {
    inner: P,
    seen: Vec<OutboxMessage>,
}

impl<P: Publisher> Publisher for Recording<P> {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        self.seen.extend_from_slice(messages);
        self.inner.publish(messages).await
    }
}

pub async fn an_unreachable_broker_is_unavailable_not_refused<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect_async().await;
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "one")]).await;
    let relay = Relay::new();

    let mut rabbit = LapinPublisher::new(
        "amqp://guest:guest@127.0.0.1:1/%2f",
        ConnectionProperties::default(),
    );
    let report = relay.run_once_async(&mut conn, &mut rabbit).await.unwrap();
    assert_eq!((report.unavailable, report.refused), (1, 0), "{report}");

    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect("nats://127.0.0.1:1")
        .await
        .unwrap();
    let mut js = jetstream::new(client);
    js.set_timeout(Duration::from_millis(300));
    let report = relay
        .run_once_async(&mut conn, &mut JetStreamPublisher::new(js))
        .await
        .unwrap();
    assert_eq!((report.unavailable, report.refused), (1, 0), "{report}");
    let attempts = conn
        .bigint("SELECT CAST(attempts AS BIGINT) AS value FROM inbox_outbox")
        .await;
    assert_eq!(attempts, 0, "unavailable rounds count nothing");
}

/// A broker connection that stops answering (a hung peer, a path that died
/// without a reset, a connection RabbitMQ blocks in a resource alarm) holds
/// a round for no longer than three quarters of the relay's lease: the
/// publish is given up, its message comes back uncounted, and the next
/// round publishes it on a new connection, under the same id.
pub async fn a_stalled_broker_connection_holds_a_round_no_longer_than_its_lease<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let Some(amqp) = rabbitmq().await else { return };
    let channel = amqp.create_channel().await.unwrap();
    let queue = run_name("stalled");
    declare_queue(&channel, &queue).await;
    let (template, upstream) = Proxy::split_url(&amqp_url(), 5672);
    let proxy = Proxy::start(&upstream);
    let mut publisher = LapinPublisher::new(proxy.url(&template), ConnectionProperties::default());
    // The rounds that connect get the default lease (a busy machine may
    // take a while to connect); the stalled one a short one.
    let relay = impatient_relay();
    let mut conn = db.connect_async().await;
    send_all(&mut conn, &[OutgoingMessage::new(queue.clone(), "before")]).await;
    let first = relay
        .run_once_async(&mut conn, &mut publisher)
        .await
        .unwrap();
    assert_eq!(first.published, 1, "{first}");

    proxy.stall();
    let ids = send_all(&mut conn, &[OutgoingMessage::new(queue.clone(), "stalled")]).await;
    let stalled = tokio::time::timeout(
        Duration::from_secs(30),
        relay
            .clone()
            .lease(Duration::from_secs(2))
            .run_once_async(&mut conn, &mut publisher),
    )
    .await
    .expect("the round ends though its broker connection is stalled")
    .unwrap();
    assert_eq!(
        (stalled.published, stalled.unavailable, stalled.refused),
        (0, 1, 0),
        "{stalled}"
    );
    assert!(
        stalled
            .last_unavailable
            .as_deref()
            .is_some_and(|reason| reason.contains("1500 ms")),
        "{stalled}"
    );
    let mut check = db.connect();
    assert_eq!(outbox::backlog(&mut check).unwrap().pending, 1);
    assert!(outbox::dead(&mut check, 0, 10).unwrap().is_empty());

    let again = tokio::time::timeout(
        Duration::from_secs(30),
        relay.run_once_async(&mut conn, &mut publisher),
    )
    .await
    .expect("the next round ends")
    .unwrap();
    assert_eq!(again.published, 1, "on a new connection: {again}");
    let mut got = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let id = message.delivery.properties.message_id().clone();
        got.push((message.delivery.data.clone(), id.map(|id| id.to_string())));
    }
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, b"before");
    assert_eq!(
        (&got[1].0[..], got[1].1.as_deref()),
        (&b"stalled"[..], Some(ids[0].as_str()))
    );
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}

/// RabbitMQ in a resource alarm blocks every connection that publishes and
/// tells it so (`connection.blocked`). The first round's publish never
/// hears back and is dropped at three quarters of the lease; every later
/// round answers unavailable at once, without publishing, on the same
/// connection: no new connection per round that the broker would block too
/// and keep open.
pub async fn a_connection_rabbitmq_blocks_is_kept_and_answered_unavailable_at_once<
    B: TestBackend,
>() {
    let Some(db) = B::open() else { return };
    let node = match inbox_test_servers::RabbitMqNode::start_in_memory_alarm() {
        Ok(node) => node,
        Err(error) => {
            inbox_tests::report_unavailable_broker("a RabbitMQ node of its own", "-", &error);
            return;
        }
    };
    let (template, upstream) = Proxy::split_url(&node.url(), 5672);
    let proxy = Proxy::start(&upstream);
    let mut publisher = LapinPublisher::new(proxy.url(&template), ConnectionProperties::default());
    let relay = impatient_relay().lease(Duration::from_secs(2));
    let mut conn = db.connect_async().await;
    send_all(
        &mut conn,
        &[OutgoingMessage::new("receipts", "during the alarm")],
    )
    .await;

    let first = tokio::time::timeout(
        Duration::from_secs(30),
        relay.run_once_async(&mut conn, &mut publisher),
    )
    .await
    .expect("the round ends though the broker blocks its publish")
    .unwrap();
    assert_eq!((first.published, first.unavailable), (0, 1), "{first}");
    for _ in 0..3 {
        let blocked = relay
            .run_once_async(&mut conn, &mut publisher)
            .await
            .unwrap();
        assert_eq!(
            (blocked.published, blocked.unavailable),
            (0, 1),
            "{blocked}"
        );
        assert!(
            blocked
                .last_unavailable
                .as_deref()
                .is_some_and(|reason| reason.contains("resource alarm")),
            "{blocked}"
        );
    }
    assert_eq!(proxy.connections(), 1, "the blocked connection is kept");
    let mut check = db.connect();
    assert_eq!(outbox::backlog(&mut check).unwrap().pending, 1);
    assert!(outbox::dead(&mut check, 0, 10).unwrap().is_empty());
}
