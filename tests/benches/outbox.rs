//! What the outbox's relay costs, on PostgreSQL and the real brokers.
//!
//! ```text
//! cargo bench -p inbox-tests --bench outbox --features outbox-brokers
//! ```
//!
//! 1. **Relay throughput against a plain publish loop**, on NATS JetStream
//!    and on RabbitMQ, interleaved round by round: each round publishes
//!    `INBOX_BENCH_MESSAGES` (10,000) messages of 128 bytes with a plain
//!    loop of the client (batches of 100 published together, then their
//!    confirmations awaited: JetStream publish acks, RabbitMQ publisher
//!    confirms), and drains as many from the outbox with `Relay::run_once_async`
//!    (batches of 100: lease, publish through `JetStreamPublisher` /
//!    `LapinPublisher`, delete the confirmed) after recording them, untimed. It prints
//!    both throughputs and the median of the per-round ratios relay ÷ loop.
//! 2. **Commit-to-publish latency at a steady load**: a producer commits
//!    one message every 5 ms (200/s) through `outbox::send`; a
//!    `BackgroundRelay` task publishes them to JetStream; the latency of a
//!    message is the broker's confirmation (the publisher's answer) minus
//!    the producer's commit, by the same clock. Woken on commit (`LISTEN`)
//!    and polling (idle wait 500 ms, no listener), 10 s each, alternated.
//!
//! It prints figures; it asserts nothing. Servers: `INBOX_TEST_POSTGRES_URL`
//! (a schema of its own), `INBOX_TEST_NATS_URL`, `INBOX_TEST_AMQP_URL`.
//! `INBOX_BENCH_PARTS` (a comma-separated list of `none`, `nats`, `rabbitmq`,
//! `latency`; all by default) runs some of it: `none` is the relay with a
//! publisher that confirms at once, the database's share.
//! `INBOX_BENCH_RELAYS` (a comma-separated list of numbers, `1,2` by
//! default) says how many relays drain side by side in each measured drain,
//! each on a connection and a tokio task of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use diesel::Connection as _;
use diesel_async::AsyncConnection as _;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use inbox_runtime::outbox::{
    self, BackgroundRelay, JetStreamPublisher, LapinPublisher, OutboxMessage, OutgoingMessage,
    PublishError, Publisher, Relay,
};
use inbox_tests::{Postgres, TestBackend};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, ConnectionProperties};

const PAYLOAD: [u8; 128] = [b'x'; 128];
const BATCH: usize = 100;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        println!(
            "outbox benchmark: run it with `cargo bench -p inbox-tests --bench outbox --features outbox-brokers`"
        );
        return;
    }
    let Some(db) = Postgres::open() else {
        println!("outbox benchmark: PostgreSQL is not reachable");
        return;
    };
    let runtime = inbox_tests::runtime::multi_thread(2);
    runtime.block_on(async {
        let nats_url = std::env::var("INBOX_TEST_NATS_URL")
            .unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
        let amqp_url = std::env::var("INBOX_TEST_AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
        let js = jetstream::new(async_nats::connect(&nats_url).await.expect("NATS"));
        let run = inbox_tests::unique_name("bench");
        js.create_stream(stream::Config {
            name: run.clone(),
            subjects: vec![format!("{run}.>")],
            ..Default::default()
        })
        .await
        .expect("a stream");
        let messages = env_number("INBOX_BENCH_MESSAGES", 10_000) as usize;
        let rounds = env_number("INBOX_BENCH_ROUNDS", 4) as usize;
        println!(
            "{} CPUs; {rounds} rounds of {messages} messages of {} bytes, batches of {BATCH}\n",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            PAYLOAD.len()
        );

        let parts = std::env::var("INBOX_BENCH_PARTS")
            .unwrap_or_else(|_| "none,nats,rabbitmq,latency".to_owned());
        let runs = |part: &str| parts.split(',').any(|named| named.trim() == part);
        if runs("none") {
            let mut discard = Vec::new();
            for _ in 0..rounds {
                discard.push(relay_drain(&db, "nowhere", messages, vec![Confirms]).await);
            }
            let per_second = median(&mut discard.iter().map(|s| s.per_second).collect::<Vec<_>>());
            let cpu_micros = median(&mut discard.iter().map(|s| s.cpu_micros).collect::<Vec<_>>());
            println!(
                "no broker       1 relay  {per_second:7.0} msg/s, {cpu_micros:5.1} µs CPU/msg \
                 (a publisher that confirms at once: the database's share)"
            );
        }
        let relay_counts: Vec<usize> = std::env::var("INBOX_BENCH_RELAYS")
            .unwrap_or_else(|_| "1,2".to_owned())
            .split(',')
            .map(str::trim)
            .filter(|count| !count.is_empty())
            .map(|count| match count.parse() {
                Ok(relays @ 1..) => relays,
                _ => panic!("INBOX_BENCH_RELAYS: {count:?} is not a number of relays (1 or more)"),
            })
            .collect();
        let subject = format!("{run}.receipts");
        let nats = JetStreamPublisher::new(js.clone());
        let mut rates = Rates::new(&relay_counts);
        for _ in 0..rounds * usize::from(runs("nats")) {
            rates.plain.push(nats_loop(&js, &subject, messages).await);
            for (count, samples) in &mut rates.relays {
                let publishers = vec![nats.clone(); *count];
                samples.push(relay_drain(&db, &subject, messages, publishers).await);
            }
        }
        if runs("nats") {
            rates.print("NATS JetStream");
        }

        let amqp = lapin::Connection::connect(&amqp_url, ConnectionProperties::default())
            .await
            .expect("RabbitMQ");
        let channel = amqp.create_channel().await.expect("a channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        channel
            .queue_declare(
                run.as_str().into(),
                QueueDeclareOptions {
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("a queue");
        let rabbit = || LapinPublisher::new(&amqp_url, ConnectionProperties::default());
        let mut rates = Rates::new(&relay_counts);
        for _ in 0..rounds * usize::from(runs("rabbitmq")) {
            rates.plain.push(amqp_loop(&channel, &run, messages).await);
            for (count, samples) in &mut rates.relays {
                let publishers = (0..*count).map(|_| rabbit()).collect();
                samples.push(relay_drain(&db, &run, messages, publishers).await);
            }
            channel
                .queue_purge(run.as_str().into(), Default::default())
                .await
                .expect("purge");
        }
        if runs("rabbitmq") {
            rates.print("RabbitMQ");
        }

        if runs("latency") {
            println!(
                "\ncommit-to-publish latency, 200 messages/s, 10 s per mode, alternated twice:"
            );
            let mut woken = Vec::new();
            let mut polled = Vec::new();
            for _ in 0..2 {
                woken.extend(latency(&db, &js, &subject, true).await);
                polled.extend(latency(&db, &js, &subject, false).await);
            }
            print_latency("woken on commit (LISTEN)", &mut woken);
            print_latency("polling (idle wait 500 ms)", &mut polled);
        }
        let _ = js.delete_stream(&run).await;
    });
}

/// Messages per second publishing `count` messages to `subject` in
/// batches: published together, then their acks awaited.
async fn nats_loop(js: &jetstream::Context, subject: &str, count: usize) -> Sample {
    let clock = Clock::start();
    for chunk in (0..count).collect::<Vec<_>>().chunks(BATCH) {
        let mut acks = Vec::with_capacity(chunk.len());
        for n in chunk {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", uuid::Uuid::now_v7().to_string().as_str());
            headers.insert("n", n.to_string().as_str());
            acks.push(
                js.publish_with_headers(subject.to_owned(), headers, PAYLOAD.to_vec().into())
                    .await
                    .expect("publish"),
            );
        }
        for ack in acks {
            ack.await.expect("an ack");
        }
    }
    clock.sample(count)
}

/// The same with RabbitMQ publisher confirms, to `queue`.
async fn amqp_loop(channel: &lapin::Channel, queue: &str, count: usize) -> Sample {
    let clock = Clock::start();
    for chunk in (0..count).collect::<Vec<_>>().chunks(BATCH) {
        let mut confirms = Vec::with_capacity(chunk.len());
        for _ in chunk {
            let properties = BasicProperties::default()
                .with_message_id(uuid::Uuid::now_v7().to_string().into())
                .with_delivery_mode(2);
            confirms.push(
                channel
                    .basic_publish(
                        "".into(),
                        queue.into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..Default::default()
                        },
                        &PAYLOAD,
                        properties,
                    )
                    .await
                    .expect("publish"),
            );
        }
        for confirm in confirms {
            assert!(confirm.await.expect("a confirm").is_ack());
        }
    }
    clock.sample(count)
}

/// Records `count` messages to `destination` (untimed), then drains them
/// with one relay per publisher, each on a connection and a tokio task of
/// its own, side by side (as relays in one process would run).
async fn relay_drain<P: Publisher + Send + 'static>(
    db: &Postgres,
    destination: &str,
    count: usize,
    publishers: Vec<P>,
) -> Sample {
    db.connect()
        .transaction(|conn| {
            for _ in 0..count {
                outbox::send(conn, &OutgoingMessage::new(destination, &PAYLOAD[..]))?;
            }
            Ok::<_, inbox_runtime::InboxError>(())
        })
        .expect("record the messages");
    // What autovacuum does to a queue table between drains (this machine's
    // server runs without it): otherwise each lease walks past every row
    // the earlier drains deleted.
    diesel::connection::SimpleConnection::batch_execute(&mut db.connect(), "VACUUM inbox_outbox")
        .expect("vacuum");
    let mut relays = Vec::new();
    for publisher in publishers {
        let conn = diesel_async::AsyncPgConnection::establish(db.url())
            .await
            .expect("PG");
        relays.push((conn, publisher));
    }
    let relay = Relay::new().batch_size(BATCH as u32);
    let clock = Clock::start();
    let tasks: Vec<_> = relays
        .into_iter()
        .map(|(mut conn, mut publisher)| {
            let relay = relay.clone();
            tokio::spawn(async move {
                let mut published = 0;
                loop {
                    let report = relay
                        .run_once_async(&mut conn, &mut publisher)
                        .await
                        .expect("a round");
                    assert_eq!(report.published, report.leased, "{report}");
                    published += report.published;
                    if report.is_idle() {
                        return published;
                    }
                }
            })
        })
        .collect();
    let mut published = 0;
    for task in tasks {
        published += task.await.expect("a relay");
    }
    assert_eq!(published, count);
    clock.sample(count)
}

/// Confirms every message at once, publishing nothing.
struct Confirms;

impl Publisher for Confirms {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        messages.iter().map(|_| Ok(())).collect()
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// When a measurement started: the wall clock and the machine's busy CPU
/// time (every process's, the database's and the broker's included).
struct Clock {
    start: Instant,
    busy_ticks: u64,
}

impl Clock {
    fn start() -> Clock {
        Clock {
            start: Instant::now(),
            busy_ticks: busy_ticks(),
        }
    }

    /// What `count` messages since the start cost.
    fn sample(&self, count: usize) -> Sample {
        let seconds = self.start.elapsed().as_secs_f64();
        let ticks = busy_ticks().saturating_sub(self.busy_ticks);
        Sample {
            per_second: count as f64 / seconds,
            // Kernel ticks are 10 ms (USER_HZ 100).
            cpu_micros: ticks as f64 * 10_000.0 / count as f64,
        }
    }
}

/// The machine's busy CPU time so far, in ticks (`/proc/stat`: all but idle,
/// iowait, the time a hypervisor stole, and guest time, which user time
/// already counts); 0 where there is no `/proc/stat`.
fn busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next() else {
        return 0;
    };
    cpu.split_whitespace()
        .skip(1)
        .enumerate()
        // user nice system idle iowait irq softirq steal guest guest_nice
        .filter(|(index, _)| matches!(index, 0..=2 | 5 | 6))
        .filter_map(|(_, value)| value.parse::<u64>().ok())
        .sum()
}

/// One measured drain or loop.
#[derive(Clone, Copy)]
struct Sample {
    per_second: f64,
    /// The machine's CPU time per message, in microseconds.
    cpu_micros: f64,
}

/// Each round's samples, by what published them: the plain loop, and
/// each number of relays side by side.
struct Rates {
    plain: Vec<Sample>,
    relays: Vec<(usize, Vec<Sample>)>,
}

impl Rates {
    fn new(relay_counts: &[usize]) -> Rates {
        Rates {
            plain: Vec::new(),
            relays: relay_counts
                .iter()
                .map(|&count| (count, Vec::new()))
                .collect(),
        }
    }

    fn print(&self, broker: &str) {
        let rate = |samples: &[Sample]| {
            median(&mut samples.iter().map(|s| s.per_second).collect::<Vec<_>>())
        };
        let cpu = |samples: &[Sample]| {
            median(&mut samples.iter().map(|s| s.cpu_micros).collect::<Vec<_>>())
        };
        println!(
            "{broker:15} plain loop {:7.0} msg/s, {:5.1} µs CPU/msg",
            rate(&self.plain),
            cpu(&self.plain)
        );
        for (count, samples) in &self.relays {
            let relays = match count {
                1 => "1 relay ".to_owned(),
                count => format!("{count} relays"),
            };
            let mut ratios: Vec<f64> = samples
                .iter()
                .zip(&self.plain)
                .map(|(r, l)| r.per_second / l.per_second)
                .collect();
            let (low, high) = (
                ratios.iter().copied().fold(f64::MAX, f64::min),
                ratios.iter().copied().fold(0.0, f64::max),
            );
            println!(
                "{:15} {relays} {:7.0} msg/s, {:5.1} µs CPU/msg   ÷ plain loop {:.2} ({low:.2}–{high:.2})",
                "",
                rate(samples),
                cpu(samples),
                median(&mut ratios),
            );
        }
    }
}

/// Forwards to JetStream, noting when each message was confirmed.
struct Timed {
    inner: JetStreamPublisher,
    confirmed: Arc<Mutex<HashMap<Vec<u8>, Instant>>>,
}

impl Publisher for Timed {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let answers = self.inner.publish(messages).await;
        let now = Instant::now();
        let mut confirmed = self.confirmed.lock().unwrap();
        for (message, answer) in messages.iter().zip(&answers) {
            if answer.is_ok() {
                confirmed.insert(message.payload.clone(), now);
            }
        }
        answers
    }
}

/// 10 s of 200 commits a second with a background relay: each message's
/// confirmation minus its commit, in milliseconds.
async fn latency(db: &Postgres, js: &jetstream::Context, subject: &str, listen: bool) -> Vec<f64> {
    let confirmed = Arc::new(Mutex::new(HashMap::new()));
    let publisher = Timed {
        inner: JetStreamPublisher::new(js.clone()),
        confirmed: Arc::clone(&confirmed),
    };
    let pool = Pool::builder(AsyncDieselConnectionManager::<
        diesel_async::AsyncPgConnection,
    >::new(db.url()))
    .max_size(2)
    .build()
    .expect("a pool");
    let mut relay = BackgroundRelay::new(Relay::new()).idle_wait(Duration::from_millis(500));
    if listen {
        relay = relay.wake_on_commit(db.url());
    }
    let task = relay.spawn_task(pool, publisher, |_| {});
    tokio::time::sleep(Duration::from_millis(500)).await;
    let url = db.url().to_owned();
    let subject = subject.to_owned();
    let committed = tokio::task::spawn_blocking(move || {
        let mut conn = diesel::PgConnection::establish(&url).expect("PG");
        let mut committed = Vec::new();
        let start = Instant::now();
        let mut n: u64 = 0;
        while start.elapsed() < Duration::from_secs(10) {
            let payload = format!("latency-{}", uuid::Uuid::now_v7()).into_bytes();
            conn.transaction(|conn| {
                outbox::send(conn, &OutgoingMessage::new(&subject, payload.clone()))
            })
            .expect("record");
            committed.push((payload, Instant::now()));
            n += 1;
            let next = start + Duration::from_millis(5 * n);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        committed
    })
    .await
    .expect("the producer");
    tokio::time::sleep(Duration::from_secs(1)).await;
    task.stop().await.expect("the relay");
    let confirmed = confirmed.lock().unwrap();
    committed
        .iter()
        .filter_map(|(payload, at)| {
            confirmed
                .get(payload)
                .map(|done| done.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect()
}

fn print_latency(what: &str, samples: &mut [f64]) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    println!(
        "  {what:28} {} messages: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        samples.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    );
}
