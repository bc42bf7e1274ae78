//! The processes of the outbox's two-service chaos test
//! (`tests/outbox_hop/`): service A's payment consumer and outbox relay,
//! and service B, which records the receipts A's relay publishes.
//!
//! ```text
//! outbox-hop consumer <database-url> <amqp-url> <run> <nats-url> <subject-prefix> [--mutation <mutation>]
//! outbox-hop relay <database-url> <nats-url> <subject-prefix>
//! outbox-hop receipts <database-url> <nats-url> <stream>
//! ```
//!
//! Each `<database-url>` carries the process's `application_name`, by which
//! the test finds its sessions (to cut them).
//!
//! # `consumer`: service A
//!
//! Consumes the payments of run `<run>` from RabbitMQ (the queue
//! `ledger.<run>.payments` of `inbox_examples::brokers::rabbitmq`, declared
//! by the test), two deliveries at a time, and runs
//! `inbox_examples::brokers::ledger::apply_payment` on each: the inbox, the
//! ledger and the payment's receipt recorded through the outbox, in one
//! transaction. Only after the handler has returned does it tell the
//! broker, as `inbox_runtime::ack_decision` says: ack (applied, or a
//! duplicate), `nack` with requeue after a backoff (nothing committed; after
//! the claim's bound when another delivery of the payment is in flight), or
//! reject to the dead-letter exchange (a rejected payment). The first
//! delivery of a payment whose number is a multiple of 7 is first run under
//! a timeout of a few hundred microseconds, which drops it partway (a
//! consumer shut down mid-delivery), then run again.
//!
//! `--mutation` replaces the outbox by one of the two designs it exists to
//! avoid, publishing the receipt straight to JetStream (subject
//! `<subject-prefix>.ledger.receipts`, each publish under a new
//! `Nats-Msg-Id`, as each transaction of the real handler records its
//! receipt under a new outbox id):
//!
//! - `publish-in-body`: from inside the handler's body, as soon as the
//!   receipt is known, before the account is touched. (Where the real
//!   handler records its receipt in the body does not matter: it commits or
//!   vanishes with the rest.) A rejected payment's receipt is out before the
//!   rejection (a ghost); an attempt killed or cut before its commit has
//!   published one, and the redelivery publishes another (a double);
//! - `publish-after-commit`: after the handler returned `Processed`, before
//!   the ack. A consumer killed between the commit and the publish loses the
//!   receipt: the redelivery is a duplicate, which publishes nothing.
//!
//! stdout, one event per line:
//!
//! ```text
//! ready                              consuming
//! delivered <id> <0|1>               a delivery; 1: RabbitMQ delivered it before
//! paused transaction <id>            stopped inside the handler's transaction
//! paused settle <id> applied         stopped after the handler applied the payment,
//!                                    before the broker is told (and before a mutant's
//!                                    publish)
//! published <id>                     a mutant published a receipt itself
//! settled <id> <verdict>[ unsettled] told the broker (unsettled: telling it failed)
//! ```
//!
//! `<verdict>`: `applied`, `duplicate`, `dead`, `retry`, `in-progress`,
//! `unprocessable`. stdin: `pause transaction` (stop the next handler
//! inside its transaction, after the balance update and the receipt),
//! `pause settle` (stop the next delivery whose handler applied its
//! payment, before the broker is told), `resume`.
//!
//! # `relay`: service A's outbox relay
//!
//! Runs a `BackgroundRelay` as a tokio task over a deadpool pool of A's
//! database, woken on commit, publishing to NATS JetStream through
//! `JetStreamPublisher`, each destination under `<subject-prefix>.`. Its
//! lease is 6 s: the JetStream context's 1 s wait for acks bounds a round's
//! publish well within it, and a held round (`hold`, below) is killed long
//! before the relay would drop its publish, at three quarters of the lease.
//! The round's row locks are its lease on PostgreSQL, so a killed relay's
//! messages are free again as soon as its session ends. After a round the
//! broker could not take, it backs off 100 ms, doubling up to 1 s. stdout:
//! `ready`, then `confirmed <n>` after each batch the broker confirmed
//! (before the relay marks it sent), `round unavailable <n> <reason>`,
//! `round refused <n> <dead> <reason>` and `round failed <reason>` for the
//! rounds that did not go through. stdin: `hold` (the next batch with a
//! confirmed message prints `holding <n>` and the relay stops there, between
//! the broker's confirmation and its mark, until killed).
//!
//! # `receipts`: service B
//!
//! Pulls the stream's messages (a durable consumer shared by every B
//! process, 2 s `ack_wait`), records each receipt with `#[idempotent]` (id:
//! the `Nats-Msg-Id` header) in `hop_receipts` (no unique key: a receipt
//! recorded twice would show), and acks after the commit. It rides out a
//! broker restart: the client reconnects, the pull resumes, and what was
//! not acknowledged comes again. stdout: `ready`, then `recorded <payment>
//! <processed|duplicate>`, and `trouble <what>` for a failed delivery or a
//! pull that broke.
//!
//! The end of stdin (the test is gone) ends every process at once.

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use async_nats::jetstream::{self, consumer::pull};
use diesel::ExpressionMethods;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures_util::StreamExt;
use inbox_examples::brokers::BoxError;
use inbox_examples::brokers::delivery::{Probe, RETRY_BACKOFF};
use inbox_examples::brokers::ledger::{self, LedgerError, Payment, PaymentBody, Receipt};
use inbox_examples::brokers::rabbitmq;
use inbox_runtime::outbox::{
    BackgroundRelay, JetStreamPublisher, OutboxMessage, PublishError, Publisher, Relay, RelayRound,
};
use inbox_runtime::{AckDecision, Backoff, ClaimWait, InboxError, Outcome, idempotent};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::FieldTable;
use tokio::sync::Notify;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Reads stdin on a thread of its own, handing each line to `command`; the
/// end of stdin ends the process.
fn listen_to_stdin(command: impl Fn(&str) + Send + 'static) {
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(line) => command(line.trim()),
                Err(_) => break,
            }
        }
        std::process::exit(0);
    });
}

fn pool(database_url: &str, size: usize) -> Result<Pool<AsyncPgConnection>, BoxError> {
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(database_url);
    Ok(Pool::builder(manager).max_size(size).build()?)
}

// ---------------------------------------------------------------------------
// Service A: the payment consumer.

/// Deliveries a consumer works on at once.
const PREFETCH: u16 = 2;

/// The claim wait of the consumer's handler, and how long a copy answered
/// "in progress" is held before it is requeued: short, so that the run's
/// copies settle within its time.
const IN_PROGRESS_PACE: Duration = Duration::from_millis(500);

/// How service A sends a payment's receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Design {
    /// Through the outbox, in the handler's transaction: the product.
    Outbox,
    /// Mutation: published from inside the handler's body.
    PublishInBody,
    /// Mutation: published after the handler returned.
    PublishAfterCommit,
}

impl Design {
    fn parse(flag: &str) -> Option<Design> {
        match flag {
            "publish-in-body" => Some(Design::PublishInBody),
            "publish-after-commit" => Some(Design::PublishAfterCommit),
            _ => None,
        }
    }
}

/// Where a consumer can be told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    /// Inside the handler's transaction.
    Transaction,
    /// After the handler applied the payment, before the broker is told.
    Settle,
}

/// The consumer's probe: stops where it was asked to, until `resume`.
#[derive(Default)]
struct Pauses {
    armed: Mutex<Option<Pause>>,
    resume: Notify,
}

impl Pauses {
    fn command(&self, line: &str) {
        match line {
            "pause transaction" => {
                *self.armed.lock().expect("not poisoned") = Some(Pause::Transaction)
            }
            "pause settle" => *self.armed.lock().expect("not poisoned") = Some(Pause::Settle),
            // `notify_one` keeps the wake-up if the pause is not waiting yet.
            "resume" => self.resume.notify_one(),
            other => eprintln!("outbox-hop consumer: unknown command {other:?}"),
        }
    }

    /// Disarms `pause` if it is armed, and says whether it was.
    fn take(&self, pause: Pause) -> bool {
        let mut armed = self.armed.lock().expect("not poisoned");
        if *armed == Some(pause) {
            *armed = None;
            true
        } else {
            false
        }
    }
}

impl Probe for Pauses {
    async fn in_transaction(&self, message_id: &str) {
        if self.take(Pause::Transaction) {
            say(&format!("paused transaction {message_id}"));
            self.resume.notified().await;
        }
    }
}

/// A mutant's way to the receipts stream: straight to JetStream.
struct DirectReceipts {
    jetstream: jetstream::Context,
    subject: String,
}

impl DirectReceipts {
    /// Publishes `receipt` under a new id and waits for the stream's ack.
    async fn publish(&self, receipt: &Receipt) -> Result<(), String> {
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, uuid::Uuid::now_v7().to_string().as_str());
        let payload = receipt.message().payload().to_vec();
        self.jetstream
            .publish_with_headers(self.subject.clone(), headers, payload.into())
            .await
            .map_err(|error| error.to_string())?
            .await
            .map_err(|error| error.to_string())?;
        say(&format!("published {}", receipt.payment));
        Ok(())
    }
}

/// What a mutant's handler fails with: the ledger's errors, and a receipt
/// it could not publish (a failed attempt).
#[derive(Debug, thiserror::Error)]
enum MutantError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("could not publish the receipt: {0}")]
    Publish(String),
}

impl From<InboxError> for MutantError {
    fn from(error: InboxError) -> Self {
        MutantError::Ledger(error.into())
    }
}

impl From<diesel::result::Error> for MutantError {
    fn from(error: diesel::result::Error) -> Self {
        MutantError::Ledger(error.into())
    }
}

/// Mutation `publish-in-body`: `ledger::apply_payment` with its receipt
/// published from the body, first thing, instead of recorded in the outbox.
#[idempotent(id = payment.id, handler = "hop.mutant.publish_in_body", max_attempts = 3)]
async fn apply_payment_publishing_in_body<P: Probe>(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    probe: &P,
    receipts: &DirectReceipts,
) -> Result<Outcome<()>, MutantError> {
    let cents = ledger::ledger_cents(&payment.body)?;
    // THE MUTATION: out to the broker before anything is committed.
    receipts
        .publish(&Receipt::of(payment, cents))
        .await
        .map_err(MutantError::Publish)?;
    ledger::credit(conn, payment, cents).await?;
    probe.in_transaction(&payment.id).await;
    ledger::hold(payment).await;
    ledger::record_entry(conn, payment, cents).await?;
    Ok(Outcome::Processed(()))
}

/// Mutation `publish-after-commit`: `ledger::apply_payment` without its
/// receipt; the consumer publishes it once the handler returned.
#[idempotent(id = payment.id, handler = "hop.mutant.publish_after_commit", max_attempts = 3)]
async fn apply_payment_without_receipt<P: Probe>(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    probe: &P,
) -> Result<Outcome<()>, LedgerError> {
    let cents = ledger::ledger_cents(&payment.body)?;
    ledger::credit(conn, payment, cents).await?;
    probe.in_transaction(&payment.id).await;
    ledger::hold(payment).await;
    ledger::record_entry(conn, payment, cents).await?;
    Ok(Outcome::Processed(()))
}

/// The broker decision for a handler's result, by `ack_decision`, and the
/// verdict the consumer prints.
fn decide<E: std::error::Error + 'static>(
    result: &Result<Outcome<()>, E>,
) -> (AckDecision, &'static str) {
    let decision = inbox_runtime::ack_decision(result);
    let verdict = match (decision, result) {
        (AckDecision::Ack, Ok(Outcome::Processed(()))) => "applied",
        (AckDecision::Ack, _) => "duplicate",
        (AckDecision::Retry, _) => "retry",
        (AckDecision::RetryLater, _) => "in-progress",
        (AckDecision::DeadLetter, _) => "dead",
    };
    (decision, verdict)
}

/// A consumer process's fixed parts.
struct Consumer {
    design: Design,
    pool: Pool<AsyncPgConnection>,
    pauses: Arc<Pauses>,
    receipts: Option<DirectReceipts>,
    failures_in_a_row: AtomicU32,
}

impl Consumer {
    /// Runs the handler of the consumer's design on `payment` once.
    async fn apply<P: Probe>(
        &self,
        conn: &mut AsyncPgConnection,
        payment: &Payment,
        probe: &P,
    ) -> (AckDecision, &'static str) {
        match (self.design, &self.receipts) {
            (Design::PublishInBody, Some(receipts)) => {
                decide(&apply_payment_publishing_in_body(conn, payment, probe, receipts).await)
            }
            (Design::PublishAfterCommit, _) => {
                decide(&apply_payment_without_receipt(conn, payment, probe).await)
            }
            _ => decide(&ledger::apply_payment(conn, payment, probe).await),
        }
    }

    /// One delivery: the handler, then the broker decision, then the ack,
    /// nack or reject.
    async fn settle(&self, delivery: Delivery) {
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned());
        let shown = id.clone().unwrap_or_else(|| "-".to_owned());
        say(&format!(
            "delivered {shown} {}",
            u8::from(delivery.redelivered)
        ));
        let (decision, verdict) = match (id, PaymentBody::decode(&delivery.data)) {
            (Some(id), Ok(body)) => {
                let payment = Payment { id, body };
                self.handle(&payment, delivery.redelivered).await
            }
            _ => (AckDecision::DeadLetter, "unprocessable"),
        };
        let told = match decision {
            AckDecision::Ack => {
                self.failures_in_a_row.store(0, Ordering::Relaxed);
                delivery.acker.ack(BasicAckOptions::default()).await
            }
            AckDecision::Retry | AckDecision::RetryLater => {
                let delay = if decision == AckDecision::Retry {
                    let failures = self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
                    RETRY_BACKOFF.after(failures)
                } else {
                    // RabbitMQ requeues at once: hold the copy first.
                    IN_PROGRESS_PACE
                };
                tokio::time::sleep(delay).await;
                let requeue = BasicNackOptions {
                    requeue: true,
                    multiple: false,
                };
                delivery.acker.nack(requeue).await
            }
            AckDecision::DeadLetter => {
                self.failures_in_a_row.store(0, Ordering::Relaxed);
                let dead_letter = BasicRejectOptions { requeue: false };
                delivery.acker.reject(dead_letter).await
            }
        };
        let unsettled = if matches!(told, Ok(true)) {
            ""
        } else {
            " unsettled"
        };
        say(&format!("settled {shown} {verdict}{unsettled}"));
    }

    async fn handle(&self, payment: &Payment, redelivered: bool) -> (AckDecision, &'static str) {
        if let Some(cut) = cut_short(&payment.id).filter(|_| !redelivered) {
            // Dropped partway: its transaction rolls back or committed; the
            // connection goes back to the pool, which discards it.
            if let Ok(mut conn) = self.pool.get().await {
                let _ = tokio::time::timeout(cut, self.apply(&mut conn, payment, &())).await;
            }
        }
        let mut conn = match self.pool.get().await {
            Ok(conn) => conn,
            Err(error) => {
                eprintln!("outbox-hop consumer: no database connection: {error}");
                return (AckDecision::Retry, "retry");
            }
        };
        let (decision, verdict) = self.apply(&mut conn, payment, &*self.pauses).await;
        if verdict == "applied" && self.pauses.take(Pause::Settle) {
            say(&format!("paused settle {} {verdict}", payment.id));
            self.pauses.resume.notified().await;
        }
        if let (Design::PublishAfterCommit, "applied", Some(receipts)) =
            (self.design, verdict, &self.receipts)
        {
            // THE MUTATION: after the commit, outside any transaction. A
            // failure here can only be logged: the payment is applied.
            let cents = ledger::ledger_cents(&payment.body).unwrap_or_default();
            if let Err(error) = receipts.publish(&Receipt::of(payment, cents)).await {
                eprintln!(
                    "outbox-hop consumer: receipt of {} lost: {error}",
                    payment.id
                );
            }
        }
        (decision, verdict)
    }
}

/// The first delivery of payment `pay-<n>`, `n` a multiple of 7, is
/// dropped after this long.
fn cut_short(id: &str) -> Option<Duration> {
    let number: u64 = id.strip_prefix("pay-")?.parse().ok()?;
    (number % 7 == 0).then(|| Duration::from_micros(200 + 300 * (number % 10)))
}

async fn consumer(
    database_url: &str,
    amqp_url: &str,
    run: &str,
    nats_url: &str,
    prefix: &str,
    design: Design,
) -> Result<(), BoxError> {
    inbox_runtime::set_default_claim_wait(ClaimWait::Bounded(IN_PROGRESS_PACE));
    let pauses = Arc::new(Pauses::default());
    let commands = Arc::clone(&pauses);
    listen_to_stdin(move |line| commands.command(line));
    let receipts = match design {
        Design::Outbox => None,
        Design::PublishInBody | Design::PublishAfterCommit => {
            let client = async_nats::connect(nats_url).await?;
            let mut jetstream = jetstream::new(client);
            jetstream.set_timeout(Duration::from_secs(1));
            Some(DirectReceipts {
                jetstream,
                subject: format!("{prefix}.{}", ledger::RECEIPTS),
            })
        }
    };
    let consumer = Consumer {
        design,
        pool: pool(database_url, usize::from(PREFETCH) + 1)?,
        pauses,
        receipts,
        failures_in_a_row: AtomicU32::new(0),
    };
    let connection =
        lapin::Connection::connect(amqp_url, lapin::ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let queue = rabbitmq::Names::of(run).queue;
    let deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "outbox-hop".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    say("ready");
    let failed: Mutex<Option<lapin::Error>> = Mutex::new(None);
    deliveries
        .for_each_concurrent(usize::from(PREFETCH), |delivery| async {
            match delivery {
                Ok(delivery) => consumer.settle(delivery).await,
                Err(error) => {
                    failed.lock().expect("not poisoned").get_or_insert(error);
                }
            }
        })
        .await;
    match failed.into_inner().expect("not poisoned") {
        Some(error) => Err(error.into()),
        None => Err("RabbitMQ cancelled the consumer".into()),
    }
}

// ---------------------------------------------------------------------------
// Service A: the outbox relay.

/// A's publisher: JetStream under the run's subject prefix, reporting each
/// confirmed batch and holding one when told to.
struct Hop {
    inner: JetStreamPublisher,
    prefix: String,
    hold: Arc<AtomicBool>,
}

impl Publisher for Hop {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let prefixed: Vec<OutboxMessage> = messages
            .iter()
            .map(|message| OutboxMessage {
                destination: format!("{}.{}", self.prefix, message.destination),
                ..message.clone()
            })
            .collect();
        let answers = self.inner.publish(&prefixed).await;
        let confirmed = answers.iter().filter(|answer| answer.is_ok()).count();
        if confirmed > 0 && self.hold.swap(false, Ordering::SeqCst) {
            say(&format!("holding {confirmed}"));
            std::future::pending::<()>().await;
        }
        say(&format!("confirmed {confirmed}"));
        answers
    }
}

/// A round that did not go through, as one stdout line.
fn report_round(round: &RelayRound) {
    match round {
        RelayRound::Done(report) if report.unavailable > 0 => say(&format!(
            "round unavailable {} {}",
            report.unavailable,
            one_line(report.last_unavailable.as_deref().unwrap_or("-"))
        )),
        RelayRound::Done(report) if report.refused > 0 => say(&format!(
            "round refused {} {} {}",
            report.refused,
            report.dead,
            one_line(&report.to_string())
        )),
        RelayRound::Done(_) => {}
        RelayRound::Failed(error) => say(&format!("round failed {}", one_line(&error.to_string()))),
        _ => say(&format!("round failed {}", one_line(&round.to_string()))),
    }
}

fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

async fn relay(database_url: &str, nats_url: &str, prefix: &str) -> Result<(), BoxError> {
    let client = async_nats::connect(nats_url).await?;
    let hold = Arc::new(AtomicBool::new(false));
    let held = Arc::clone(&hold);
    listen_to_stdin(move |line| {
        if line == "hold" {
            held.store(true, Ordering::SeqCst);
        }
    });
    // The wait for acks bounds a round's publish: well within the lease,
    // and a held round is killed well before the relay would drop its
    // publish (at three quarters of the lease).
    let mut context = jetstream::new(client);
    context.set_timeout(Duration::from_secs(1));
    let publisher = Hop {
        inner: JetStreamPublisher::new(context),
        prefix: prefix.to_owned(),
        hold,
    };
    // Sent receipts are kept: the ledger's check compares what A recorded
    // with what B received.
    let relay = Relay::new()
        .batch_size(20)
        .lease(Duration::from_secs(6))
        .keep_sent(true);
    let _task = BackgroundRelay::new(relay)
        .idle_wait(Duration::from_millis(200))
        .backoff(Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(1),
        })
        .wake_on_commit(database_url)
        .spawn_task(pool(database_url, 2)?, publisher, report_round);
    say("ready");
    std::future::pending::<()>().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// Service B: the receipts consumer.

diesel::table! {
    /// Service B's effect: one row per receipt recorded.
    hop_receipts (id) {
        /// The row's own key.
        id -> BigInt,
        /// The payment's message id, as the receipt says.
        payment -> Text,
        /// The account credited.
        account -> BigInt,
        /// The amount credited, in cents.
        cents -> BigInt,
    }
}

/// Records one receipt, once per message id.
#[idempotent(id = message_id, handler = "receipts.record")]
async fn record(
    conn: &mut AsyncPgConnection,
    message_id: &str,
    receipt: &Receipt,
) -> Result<Outcome<()>, InboxError> {
    diesel::insert_into(hop_receipts::table)
        .values((
            hop_receipts::payment.eq(&receipt.payment),
            hop_receipts::account.eq(receipt.account),
            hop_receipts::cents.eq(receipt.cents),
        ))
        .execute(conn)
        .await
        .map_err(InboxError::from)?;
    Ok(Outcome::Processed(()))
}

/// Records one pulled receipt and acks it; `Err` for a delivery that comes
/// again (after `ack_wait`).
async fn record_one(
    pool: &Pool<AsyncPgConnection>,
    message: &jetstream::Message,
) -> Result<(), BoxError> {
    let id = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(NATS_MESSAGE_ID))
        .map(|id| id.as_str().to_owned())
        .ok_or("a receipt without Nats-Msg-Id")?;
    let receipt = Receipt::parse(&message.payload)?;
    let mut conn = pool.get().await?;
    let kind = match record(&mut conn, &id, &receipt).await? {
        Outcome::Processed(()) => "processed",
        Outcome::Duplicate => "duplicate",
    };
    // A lost ack (the broker restarting) is a redelivery, which the inbox
    // absorbs.
    message.ack().await?;
    say(&format!("recorded {} {kind}", receipt.payment));
    Ok(())
}

async fn receipts(database_url: &str, nats_url: &str, stream: &str) -> Result<(), BoxError> {
    let client = async_nats::connect(nats_url).await?;
    listen_to_stdin(|_| {});
    let consumer = jetstream::new(client)
        .get_stream(stream)
        .await?
        .get_or_create_consumer(
            "receipts",
            pull::Config {
                durable_name: Some("receipts".to_owned()),
                ack_wait: Duration::from_secs(2),
                ..Default::default()
            },
        )
        .await?;
    let pool = pool(database_url, 2)?;
    let mut messages = consumer.messages().await?;
    say("ready");
    loop {
        match messages.next().await {
            Some(Ok(message)) => {
                if let Err(error) = record_one(&pool, &message).await {
                    say(&format!("trouble {}", one_line(&error.to_string())));
                }
            }
            // A missed heartbeat while the broker restarts: the pull goes
            // on once the client has reconnected.
            Some(Err(error)) => say(&format!("trouble {}", one_line(&error.to_string()))),
            None => {
                say("trouble the pull ended");
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Ok(again) = consumer.messages().await {
                    messages = again;
                }
            }
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = inbox_tests::runtime::multi_thread(2);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        [
            "consumer",
            database_url,
            amqp_url,
            run,
            nats_url,
            prefix,
            mutation @ ..,
        ] => {
            let design = match mutation {
                [] => Design::Outbox,
                ["--mutation", flag] => match Design::parse(flag) {
                    Some(design) => design,
                    None => return usage(),
                },
                _ => return usage(),
            };
            runtime.block_on(consumer(
                database_url,
                amqp_url,
                run,
                nats_url,
                prefix,
                design,
            ))
        }
        ["relay", database_url, nats_url, prefix] => {
            runtime.block_on(relay(database_url, nats_url, prefix))
        }
        ["receipts", database_url, nats_url, stream] => {
            runtime.block_on(receipts(database_url, nats_url, stream))
        }
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("outbox-hop: {error}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: outbox-hop consumer <database-url> <amqp-url> <run> <nats-url> <subject-prefix> \
         [--mutation publish-in-body|publish-after-commit]\n       \
         outbox-hop relay <database-url> <nats-url> <subject-prefix>\n       \
         outbox-hop receipts <database-url> <nats-url> <stream>"
    );
    ExitCode::from(2)
}
