//! A payment consumer behind an at-least-once broker, made idempotent with one
//! attribute.
//!
//! ```text
//! cargo run --example quickstart                       # embedded SQLite, no server
//! DATABASE_URL=postgres://postgres@127.0.0.1/test \
//!     cargo run --example quickstart --features postgres
//! ```
//!
//! The simulated broker delivers every message at least once: it redelivers
//! a good share of them (as after a lost acknowledgement or a consumer-group
//! rebalance), and the first attempt at some messages fails with a transient
//! error (as after a timeout), so the broker retries them later. The final
//! balances must equal the sum of the distinct payments: exactly-once effects.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;

use diesel::prelude::*;
use inbox_runtime::{idempotent, Backoff, InboxBackend, InboxError, Outcome, Recovery};
use uuid::Uuid;

diesel::table! {
    /// The effects: one balance per account.
    quickstart_accounts (id) {
        /// The account number.
        id -> Integer,
        /// Its balance in cents.
        balance_cents -> BigInt,
    }
}

/// A message as the producer published it: the producer assigns `id`.
#[derive(Debug, Clone)]
struct PaymentReceived {
    id: Uuid,
    account: i32,
    amount_cents: i64,
}

/// The consumer's error type: database failures, inbox failures, and a
/// simulated transient failure.
#[derive(Debug)]
enum AppError {
    Database(diesel::result::Error),
    Inbox(InboxError),
    Transient(&'static str),
}

impl AppError {
    /// What the consumer does next: nack (the broker redelivers), reconnect
    /// then deliver again, or dead-letter.
    fn recovery(&self) -> Recovery {
        match self {
            AppError::Database(error) => inbox_runtime::recovery(error),
            AppError::Inbox(error) => error.recovery(),
            AppError::Transient(_) => Recovery::Retry,
        }
    }
}

impl From<diesel::result::Error> for AppError {
    fn from(error: diesel::result::Error) -> Self {
        AppError::Database(error)
    }
}

impl From<InboxError> for AppError {
    fn from(error: InboxError) -> Self {
        AppError::Inbox(error)
    }
}

impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppError::Database(e) => write!(f, "database: {e}"),
            AppError::Inbox(e) => write!(f, "inbox: {e}"),
            AppError::Transient(why) => write!(f, "transient failure: {why}"),
        }
    }
}

impl Error for AppError {
    /// The inbox's error stays reachable, so `inbox_runtime::ack_decision`
    /// and the runtime can read it.
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            AppError::Database(e) => Some(e),
            AppError::Inbox(e) => Some(e),
            AppError::Transient(_) => None,
        }
    }
}

/// The effects of payments, written and read through the handler's
/// connection. One implementation per backend, from the same Diesel queries.
trait Ledger: diesel::connection::LoadConnection {
    fn credit(&mut self, account: i32, amount_cents: i64) -> QueryResult<usize>;
    fn balances(&mut self) -> QueryResult<BTreeMap<i32, i64>>;
}

macro_rules! ledger_for {
    ($connection:ty) => {
        impl Ledger for $connection {
            fn credit(&mut self, account: i32, amount_cents: i64) -> QueryResult<usize> {
                use quickstart_accounts::{balance_cents, table as accounts};
                diesel::update(accounts.find(account))
                    .set(balance_cents.eq(balance_cents + amount_cents))
                    .execute(self)
            }

            fn balances(&mut self) -> QueryResult<BTreeMap<i32, i64>> {
                use quickstart_accounts::{id, table as accounts};
                let rows = accounts.order(id).load::<(i32, i64)>(self)?;
                Ok(rows.into_iter().collect())
            }
        }
    };
}

ledger_for!(SqliteConnection);
#[cfg(feature = "postgres")]
ledger_for!(diesel::PgConnection);

/// The handler. `#[idempotent]` runs the body in one transaction that first
/// claims `msg.id` under the scope "billing.apply_payment"; a redelivery is
/// skipped and returns `Outcome::Duplicate`.
#[idempotent(id = msg.id, handler = "billing.apply_payment")]
fn apply_payment<C>(
    conn: &mut C,
    msg: &PaymentReceived,
    fail_this_attempt: bool,
) -> Result<Outcome<()>, AppError>
where
    C: Ledger,
    C::Backend: InboxBackend,
{
    conn.credit(msg.account, msg.amount_cents)?;
    if fail_this_attempt {
        // The credit above rolls back together with the claim, so the
        // broker's retry processes the message as if for the first time.
        return Err(AppError::Transient("downstream timeout"));
    }
    Ok(Outcome::Processed(()))
}

/// A deterministic pseudo-random sequence, so every run tells the same story.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

const ACCOUNTS: i32 = 5;
const MESSAGES: usize = 200;

/// One delivery attempt as the broker makes it.
struct Delivery {
    message: PaymentReceived,
    fails: bool,
}

/// What the producer published.
fn publish(rng: &mut XorShift) -> Vec<PaymentReceived> {
    (0..MESSAGES)
        .map(|_| PaymentReceived {
            id: Uuid::new_v4(), // assigned by the producer, carried in the envelope
            account: 1 + rng.below(ACCOUNTS as u64) as i32,
            amount_cents: 100 + rng.below(9_900) as i64,
        })
        .collect()
}

/// At-least-once delivery: every message once, 40% of them again (a lost
/// acknowledgement, or a rebalance storm of three), and for 10% the first
/// attempt fails with a timeout and is retried. All in a shuffled order.
fn at_least_once(published: &[PaymentReceived], rng: &mut XorShift) -> Vec<Delivery> {
    let mut attempts: Vec<(usize, bool)> = Vec::new();
    for (index, _) in published.iter().enumerate() {
        let fails_once = rng.below(10) == 0;
        let redeliveries = match rng.below(10) {
            0..=5 => 0,
            6..=8 => 1,
            _ => 3,
        };
        let copies = 1 + redeliveries + usize::from(fails_once);
        attempts.extend(std::iter::repeat_n((index, fails_once), copies));
    }
    for i in (1..attempts.len()).rev() {
        attempts.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut seen = vec![false; published.len()];
    attempts
        .into_iter()
        .map(|(index, fails_once)| {
            let first = !std::mem::replace(&mut seen[index], true);
            Delivery {
                message: published[index].clone(),
                fails: fails_once && first,
            }
        })
        .collect()
}

#[derive(Debug, Default)]
struct Tally {
    processed: usize,
    duplicates: usize,
    failed: usize,
    dead_lettered: usize,
}

/// How many times in a row the consumer reconnects before it gives up.
const RECONNECTS: u32 = 8;

/// How many times a delivery that failed with `Recovery::Retry` is tried
/// again at once before it is nacked.
const RETRIES_AT_ONCE: u32 = 3;

/// The consumer loop: ack on `Ok`, and on `Err` what the error's
/// [`Recovery`] says: try again at once a few times, then nack (the broker
/// redelivers later); dead-letter; or get a new connection (waiting
/// [`Backoff::DEFAULT`] between attempts) and deliver again.
fn consume<C>(
    conn: &mut C,
    connect: &dyn Fn() -> ConnectionResult<C>,
    deliveries: &[Delivery],
) -> Result<Tally, Box<dyn Error>>
where
    C: Ledger,
    C::Backend: InboxBackend,
{
    let mut tally = Tally::default();
    for delivery in deliveries {
        let (mut retries, mut reconnects) = (0, 0);
        loop {
            let error = match apply_payment(conn, &delivery.message, delivery.fails) {
                Ok(Outcome::Processed(())) => {
                    tally.processed += 1;
                    break;
                }
                Ok(Outcome::Duplicate) => {
                    tally.duplicates += 1;
                    break;
                }
                Err(error) => error,
            };
            match error.recovery() {
                // At once: a lock conflict (or a Galera commit refused by
                // certification) usually settles on the next try. The
                // handler's own failure is left to the broker's redelivery
                // (each one is a counted attempt: see `max_attempts`).
                Recovery::Retry
                    if retries < RETRIES_AT_ONCE && matches!(error, AppError::Database(_)) =>
                {
                    retries += 1;
                    continue;
                }
                Recovery::Retry => tally.failed += 1, // nack: the broker redelivers it later
                // Another delivery of the message is in flight: nack after a delay.
                Recovery::RetryLater => tally.failed += 1,
                Recovery::Never => tally.dead_lettered += 1,
                Recovery::Reconnect if reconnects < RECONNECTS => {
                    reconnects += 1;
                    std::thread::sleep(Backoff::DEFAULT.after(reconnects));
                    if let Ok(fresh) = connect() {
                        *conn = fresh;
                    }
                    continue; // deliver it again, on the new connection
                }
                _ => return Err(format!("giving up on {}: {error:?}", delivery.message.id).into()),
            }
            break;
        }
    }
    Ok(tally)
}

fn run<C>(
    conn: &mut C,
    connect: &dyn Fn() -> ConnectionResult<C>,
    backend: &str,
) -> Result<(), Box<dyn Error>>
where
    C: Ledger,
    C::Backend: InboxBackend,
{
    inbox_runtime::setup(conn)?;
    let accounts: Vec<String> = (1..=ACCOUNTS).map(|id| format!("({id}, 0)")).collect();
    conn.batch_execute(&format!(
        "DROP TABLE IF EXISTS quickstart_accounts;
         CREATE TABLE quickstart_accounts (id INTEGER PRIMARY KEY, balance_cents BIGINT NOT NULL);
         INSERT INTO quickstart_accounts (id, balance_cents) VALUES {};",
        accounts.join(", ")
    ))?;

    let mut rng = XorShift(0x5EED_CAFE_F00D_D00D);
    let published = publish(&mut rng);
    let deliveries = at_least_once(&published, &mut rng);
    let tally = consume(conn, connect, &deliveries)?;
    let balances = conn.balances()?;

    let mut expected: BTreeMap<i32, i64> = (1..=ACCOUNTS).map(|id| (id, 0)).collect();
    for message in &published {
        *expected.entry(message.account).or_default() += message.amount_cents;
    }

    println!("backend:    {backend}");
    println!("messages:   {} published", published.len());
    println!(
        "deliveries: {} ({} more than messages)",
        deliveries.len(),
        deliveries.len() - published.len()
    );
    println!("processed:  {}", tally.processed);
    println!("duplicates: {} (skipped, no effect)", tally.duplicates);
    println!("failed:     {} (rolled back, then retried)", tally.failed);
    println!("dead:       {} (dead-lettered)", tally.dead_lettered);
    let naive_credits = deliveries.iter().filter(|d| !d.fails).count();
    println!(
        "without the inbox, {naive_credits} credits would have been applied for {} payments",
        published.len()
    );
    println!("\naccount     balance    expected");
    for (account, balance) in &balances {
        let want = expected.get(account).copied().unwrap_or_default();
        println!(
            "{account:>7} {:>11.2} {:>11.2}",
            cents(*balance),
            cents(want)
        );
    }
    if balances == expected && tally.processed == published.len() {
        println!(
            "\nexactly-once effects: each of the {} payments was applied once",
            published.len()
        );
        Ok(())
    } else {
        Err("the balances do not match the distinct payments".into())
    }
}

fn cents(amount: i64) -> f64 {
    amount as f64 / 100.0
}

fn main() -> Result<(), Box<dyn Error>> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            run_postgres(&url)
        }
        Ok(url) => {
            let connect = || SqliteConnection::establish(&url);
            run(&mut connect()?, &connect, "SQLite")
        }
        Err(_) => run(
            &mut SqliteConnection::establish(":memory:")?,
            // An in-memory database lives and dies with its one connection.
            &|| {
                Err(ConnectionError::BadConnection(
                    "an in-memory database cannot be reopened".to_owned(),
                ))
            },
            "SQLite (embedded, in memory)",
        ),
    }
}

#[cfg(feature = "postgres")]
fn run_postgres(url: &str) -> Result<(), Box<dyn Error>> {
    let connect = || diesel::PgConnection::establish(url);
    run(&mut connect()?, &connect, "PostgreSQL")
}

#[cfg(not(feature = "postgres"))]
fn run_postgres(_url: &str) -> Result<(), Box<dyn Error>> {
    Err("DATABASE_URL names PostgreSQL: run with `--features postgres`".into())
}
