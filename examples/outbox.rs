//! A handler that applies payments and sends a receipt for each one through
//! the transactional outbox, with a relay publishing the receipts in the
//! background: embedded SQLite, no server, no broker (the "broker" prints
//! what it is given and confirms it).
//!
//! ```text
//! cargo run --example outbox
//! ```
//!
//! Every payment is delivered twice and some first attempts fail after the
//! receipt was recorded: each payment is applied once and its receipt
//! published once, in the account's order; a failed attempt's receipt
//! vanishes with its rollback.

use std::error::Error;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool};
use inbox_runtime::outbox::{
    self, BackgroundRelay, BlockingPublisher, OutboxMessage, OutgoingMessage, PublishError, Relay,
};
use inbox_runtime::{idempotent, InboxError, Outcome};

/// A broker that prints and confirms what it is given, and keeps it.
#[derive(Clone, Default)]
struct PrintingBroker {
    published: Arc<Mutex<Vec<String>>>,
}

impl BlockingPublisher for PrintingBroker {
    fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut published = self.published.lock().expect("not poisoned");
        for message in messages {
            let payload = String::from_utf8_lossy(&message.payload).into_owned();
            println!(
                "  published {} to {}: {payload}",
                message.id, message.destination
            );
            published.push(payload);
        }
        messages.iter().map(|_| Ok(())).collect()
    }
}

/// The handler's error: the database's, the inbox's, or the payment
/// provider's (simulated).
#[derive(Debug)]
enum PaymentError {
    Database(diesel::result::Error),
    Inbox(InboxError),
    ProviderTimeout,
}

impl fmt::Display for PaymentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PaymentError::Database(error) => error.fmt(f),
            PaymentError::Inbox(error) => error.fmt(f),
            PaymentError::ProviderTimeout => f.write_str("the payment provider timed out"),
        }
    }
}

impl Error for PaymentError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            PaymentError::Database(error) => Some(error),
            PaymentError::Inbox(error) => Some(error),
            PaymentError::ProviderTimeout => None,
        }
    }
}

impl From<diesel::result::Error> for PaymentError {
    fn from(error: diesel::result::Error) -> Self {
        PaymentError::Database(error)
    }
}

impl From<InboxError> for PaymentError {
    fn from(error: InboxError) -> Self {
        PaymentError::Inbox(error)
    }
}

/// Every connection of the pool waits for SQLite's write lock instead of
/// failing at once: the relay and the handler write the same file.
#[derive(Debug)]
struct BusyTimeout;

impl CustomizeConnection<SqliteConnection, diesel::r2d2::Error> for BusyTimeout {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), diesel::r2d2::Error> {
        conn.batch_execute("PRAGMA busy_timeout = 5000;")
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// Applies a payment once and records its receipt in the same transaction;
/// `fail` makes the attempt fail after the receipt was recorded.
#[idempotent(id = id, handler = "example.apply_payment")]
fn apply_payment(
    conn: &mut SqliteConnection,
    id: &str,
    account: i32,
    cents: i64,
    fail: bool,
) -> Result<Outcome<()>, PaymentError> {
    diesel::sql_query("UPDATE outbox_accounts SET balance_cents = balance_cents + ? WHERE id = ?")
        .bind::<diesel::sql_types::BigInt, _>(cents)
        .bind::<diesel::sql_types::Integer, _>(account)
        .execute(conn)?;
    let receipt = format!("payment {id}: {cents} cents to account {account}");
    outbox::send(
        conn,
        &OutgoingMessage::new("receipts", receipt).ordering_key(account.to_string()),
    )?;
    if fail {
        return Err(PaymentError::ProviderTimeout);
    }
    Ok(Outcome::Processed(()))
}

fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::temp_dir().join(format!("inbox-outbox-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = dir.join("outbox.db").display().to_string();
    let pool = Pool::builder()
        .max_size(2)
        .connection_customizer(Box::new(BusyTimeout))
        .build(ConnectionManager::<SqliteConnection>::new(&url))?;
    let mut conn = pool.get()?;
    conn.batch_execute(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE outbox_accounts (id INTEGER PRIMARY KEY, balance_cents BIGINT NOT NULL);
         INSERT INTO outbox_accounts VALUES (1, 0), (2, 0);",
    )?;
    inbox_runtime::setup(&mut *conn)?;

    let broker = PrintingBroker::default();
    let relay = BackgroundRelay::new(Relay::new())
        .idle_wait(Duration::from_millis(100))
        .spawn(pool.clone(), broker.clone(), |round| {
            if !round.is_ok() {
                eprintln!("{round}");
            }
        })?;

    let payments = [
        ("p-1", 1, 500),
        ("p-2", 2, 250),
        ("p-3", 1, 125),
        ("p-4", 2, 75),
    ];
    for (n, &(id, account, cents)) in payments.iter().enumerate() {
        // The first attempt at every other payment fails after recording its
        // receipt; the broker delivers every payment again, twice.
        let fail = n % 2 == 1;
        for attempt in 0..3 {
            let answer = match apply_payment(&mut conn, id, account, cents, fail && attempt == 0) {
                Ok(Outcome::Processed(())) => "processed, its receipt recorded".to_owned(),
                Ok(Outcome::Duplicate) => "duplicate, nothing recorded".to_owned(),
                Err(error) => format!("failed ({error}), its receipt rolled back"),
            };
            println!("delivery {} of {id}: {answer}", attempt + 1);
        }
        relay.run_now();
    }

    let deadline = Instant::now() + Duration::from_secs(10);
    while broker.published.lock().expect("not poisoned").len() < payments.len() {
        assert!(
            Instant::now() < deadline,
            "the relay published every receipt"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    relay.stop().expect("the relay thread never panics");
    let backlog = outbox::backlog(&mut *conn)?;
    let published = broker.published.lock().expect("not poisoned").len();
    println!(
        "\n{} payments, {published} receipts published, {} pending, {} dead",
        payments.len(),
        backlog.pending,
        backlog.dead
    );
    assert_eq!(published, payments.len(), "one receipt per payment");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
