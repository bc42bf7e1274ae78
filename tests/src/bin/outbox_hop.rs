//! The processes of the outbox's two-service chaos test
//! (`tests/outbox_hop/`): service A's outbox relay, and service
//! B, which records the receipts A's relay publishes.
//!
//! ```text
//! outbox-hop relay <database-url> <nats-url> <subject-prefix>
//! outbox-hop receipts <database-url> <nats-url> <stream>
//! ```
//!
//! `relay` runs a `BackgroundRelay` as a tokio task over a deadpool pool of
//! A's database, woken on commit, publishing to NATS JetStream through
//! `JetStreamPublisher`, each destination under `<subject-prefix>.`. Its
//! lease is 2 s: the messages of a killed relay go out again 2 s later.
//! stdout: `ready`, then `confirmed <n>` after each batch the broker
//! confirmed (before the relay marks it sent). stdin: `hold` (the next
//! confirmed batch prints `holding <n>` and the relay stops there, between
//! the broker's confirmation and its mark, until killed).
//!
//! `receipts` is service B: it pulls the stream's messages (a durable
//! consumer shared by every B process, 2 s `ack_wait`), records each
//! receipt with `#[idempotent]` (id: the `Nats-Msg-Id` header, the outbox
//! id) in `hop_receipts` (no unique key: a receipt recorded twice would
//! show), and acks after the commit. stdout: `ready`, then `recorded
//! <payment> <processed|duplicate>`.
//!
//! The end of stdin (the test is gone) ends either process at once.

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures_util::StreamExt;
use inbox_examples::brokers::BoxError;
use inbox_examples::brokers::ledger::Receipt;
use inbox_runtime::outbox::{
    BackgroundRelay, JetStreamPublisher, OutboxMessage, PublishError, Publisher, Relay,
};
use inbox_runtime::{InboxError, Outcome, idempotent};

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Reads stdin on a thread of its own: `hold` sets `hold`; the end of
/// stdin ends the process.
fn listen_to_stdin(hold: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line.as_deref() {
                Ok("hold") => hold.store(true, Ordering::SeqCst),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        std::process::exit(0);
    });
}

fn pool(database_url: &str) -> Result<Pool<AsyncPgConnection>, BoxError> {
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(database_url);
    Ok(Pool::builder(manager).max_size(2).build()?)
}

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
        if self.hold.swap(false, Ordering::SeqCst) {
            say(&format!("holding {confirmed}"));
            std::future::pending::<()>().await;
        }
        say(&format!("confirmed {confirmed}"));
        answers
    }
}

async fn relay(database_url: &str, nats_url: &str, prefix: &str) -> Result<(), BoxError> {
    let client = async_nats::connect(nats_url).await?;
    let hold = Arc::new(AtomicBool::new(false));
    listen_to_stdin(Arc::clone(&hold));
    let publisher = Hop {
        inner: JetStreamPublisher::new(jetstream::new(client)),
        prefix: prefix.to_owned(),
        hold,
    };
    let relay = Relay::new().batch_size(20).lease(Duration::from_secs(2));
    let _task = BackgroundRelay::new(relay)
        .idle_wait(Duration::from_millis(200))
        .wake_on_commit(database_url)
        .spawn_task(pool(database_url)?, publisher, |round| {
            if !round.is_ok() {
                eprintln!("outbox-hop relay: {round}");
            }
        });
    say("ready");
    std::future::pending::<()>().await;
    Ok(())
}

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

/// Records one receipt, once per outbox id.
#[idempotent(id = message_id, handler = "receipts.record")]
async fn record(
    conn: &mut AsyncPgConnection,
    message_id: &str,
    receipt: &Receipt,
) -> Result<Outcome<()>, InboxError> {
    use diesel::ExpressionMethods;
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

async fn receipts(database_url: &str, nats_url: &str, stream: &str) -> Result<(), BoxError> {
    let client = async_nats::connect(nats_url).await?;
    listen_to_stdin(Arc::new(AtomicBool::new(false)));
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
    let pool = pool(database_url)?;
    let mut messages = consumer.messages().await?;
    say("ready");
    while let Some(message) = messages.next().await {
        let message = message?;
        let id = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get("Nats-Msg-Id"))
            .map(|id| id.as_str().to_owned())
            .ok_or("a receipt without Nats-Msg-Id")?;
        let receipt = Receipt::parse(&message.payload)?;
        let mut conn = pool.get().await?;
        match record(&mut conn, &id, &receipt).await {
            Ok(outcome) => {
                let kind = match outcome {
                    Outcome::Processed(()) => "processed",
                    Outcome::Duplicate => "duplicate",
                };
                message.ack().await?;
                say(&format!("recorded {} {kind}", receipt.payment));
            }
            // Redelivered after ack_wait.
            Err(error) => eprintln!("outbox-hop receipts: {error}"),
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = inbox_tests::runtime::multi_thread(2);
    let result = match args.as_slice() {
        [mode, database_url, nats_url, prefix] if mode == "relay" => {
            runtime.block_on(relay(database_url, nats_url, prefix))
        }
        [mode, database_url, nats_url, stream] if mode == "receipts" => {
            runtime.block_on(receipts(database_url, nats_url, stream))
        }
        _ => {
            eprintln!(
                "usage: outbox-hop relay <database-url> <nats-url> <subject-prefix>\n       \
                 outbox-hop receipts <database-url> <nats-url> <stream>"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("outbox-hop: {error}");
            ExitCode::FAILURE
        }
    }
}
