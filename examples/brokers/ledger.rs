//! The ledger: its tables in PostgreSQL, the payment message, and the
//! idempotent handler that applies a payment.
//!
//! A payment adds `amount_cents` to one account's balance and writes one
//! ledger entry, in the handler's transaction. `ledger_entries` has **no**
//! unique constraint on the message id on purpose: a payment applied twice
//! would show up as two entries, which [`check`](super::check) counts.

use diesel::connection::SimpleConnection;
use diesel::{Connection, ExpressionMethods, PgConnection, QueryDsl};
use diesel_async::pooled_connection::deadpool;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_runtime::outbox::{self, OutgoingMessage};
use inbox_runtime::{idempotent, InboxError, Outcome};
use serde::{Deserialize, Serialize};

use super::delivery::Probe;
use super::BoxError;

/// The handler's deduplication scope, as written in its attribute.
pub const HANDLER: &str = "ledger.apply_payment";

/// Failed attempts before a payment is dead, as written in the handler's
/// attribute (`max_attempts = 3`).
pub const MAX_ATTEMPTS: u32 = 3;

/// The currency the ledger books in.
pub const LEDGER_CURRENCY: &str = "EUR";

/// The ISO 4217 code reserved for testing: the FX quote service of this
/// example always fails for it, so its payments exhaust their attempts.
pub const UNQUOTED_CURRENCY: &str = "XTS";

/// A pool of connections to the ledger's database.
pub type Pool = deadpool::Pool<AsyncPgConnection>;

diesel::table! {
    /// One balance per account.
    ledger_accounts (id) {
        /// The account number.
        id -> BigInt,
        /// Its balance in cents of the ledger's currency (EUR).
        balance_cents -> BigInt,
    }
}

diesel::table! {
    /// One row per applied payment.
    ledger_entries (entry_id) {
        /// The entry's own key.
        entry_id -> BigInt,
        /// The payment's message id (not unique: see the module docs).
        message_id -> Text,
        /// The account credited.
        account_id -> BigInt,
        /// The amount credited, in cents.
        amount_cents -> BigInt,
    }
}

diesel::table! {
    /// The columns of the inbox's failure table (`inbox_failures`, created
    /// by `inbox_runtime::setup`) that tell a dead message: a row with
    /// `dead_at` set.
    inbox_failures (handler, message_id) {
        /// The handler (deduplication scope).
        handler -> Text,
        /// The message id.
        message_id -> Text,
        /// When the message was recorded as dead.
        dead_at -> Nullable<Timestamptz>,
    }
}

/// The ledger's tables. No unique constraint on `ledger_entries.message_id`:
/// see the module docs.
pub const SCHEMA_SQL: &str = "\
CREATE TABLE IF NOT EXISTS ledger_accounts (
    id            BIGINT PRIMARY KEY,
    balance_cents BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS ledger_entries (
    entry_id     BIGSERIAL PRIMARY KEY,
    message_id   TEXT   NOT NULL,
    account_id   BIGINT NOT NULL REFERENCES ledger_accounts (id),
    amount_cents BIGINT NOT NULL
);";

/// A payment's payload, as the producer serialises it (JSON).
///
/// ```
/// use inbox_examples::brokers::ledger::PaymentBody;
/// let body = PaymentBody { account: 3, amount_cents: 250, currency: "EUR".into(), hold_ms: 0 };
/// assert_eq!(PaymentBody::decode(&body.encode()).unwrap(), body);
/// assert_eq!(body.encode(), br#"{"account":3,"amount_cents":250,"currency":"EUR"}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentBody {
    /// The account to credit.
    pub account: i64,
    /// The amount, in cents of `currency`.
    pub amount_cents: i64,
    /// The payment's currency (ISO 4217).
    pub currency: String,
    /// How long the handler holds its transaction open after crediting the
    /// account, in milliseconds: a slow body (a payment provider that takes
    /// its time), so that copies of the payment arrive while it runs. Left
    /// out of the payload when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hold_ms: u64,
}

fn is_zero(ms: &u64) -> bool {
    *ms == 0
}

impl PaymentBody {
    /// The payload's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a payment serialises")
    }

    /// Reads a payload.
    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// A payment as the consumer hands it to the handler: the producer's id
/// (from the broker's metadata) and the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    /// The producer-assigned message id, the same on every delivery.
    pub id: String,
    /// The payload.
    pub body: PaymentBody,
}

/// The outbox destination of the receipts: the subject or routing key the
/// relay publishes them to.
pub const RECEIPTS: &str = "ledger.receipts";

/// What the ledger tells the next service about an applied payment: one
/// receipt per payment, recorded with it.
///
/// ```
/// use inbox_examples::brokers::ledger::Receipt;
/// let receipt = Receipt { payment: "pay-1".into(), account: 3, cents: 250 };
/// let message = receipt.message();
/// assert_eq!(message.destination(), "ledger.receipts");
/// assert_eq!(message.key(), Some("3"));
/// assert_eq!(Receipt::parse(message.payload()).unwrap(), receipt);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The payment's message id.
    pub payment: String,
    /// The account credited.
    pub account: i64,
    /// The amount credited, in cents of the ledger's currency.
    pub cents: i64,
}

impl Receipt {
    /// The receipt of `payment`, applied as `cents`.
    pub fn of(payment: &Payment, cents: i64) -> Receipt {
        Receipt {
            payment: payment.id.clone(),
            account: payment.body.account,
            cents,
        }
    }

    /// The receipt as an outgoing message to [`RECEIPTS`], keyed by account
    /// (an account's receipts go out in the order they were applied).
    pub fn message(&self) -> OutgoingMessage {
        OutgoingMessage::json(RECEIPTS, self).ordering_key(self.account.to_string())
    }

    /// A receipt from its published payload.
    pub fn parse(payload: &[u8]) -> Result<Receipt, serde_json::Error> {
        serde_json::from_slice(payload)
    }
}

/// What applying a payment can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A statement of the body failed.
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
    /// The inbox's own error: an invalid id, a lost transaction, a
    /// rejection, exhausted attempts. `ack_decision` reads it through this
    /// variant (`transparent` forwards `source()`).
    #[error(transparent)]
    Inbox(#[from] InboxError),
    /// The FX quote service failed: a failed attempt, retried by the
    /// broker, and dead after [`MAX_ATTEMPTS`].
    #[error("no exchange rate from {currency} to {LEDGER_CURRENCY}: the FX quote service failed")]
    NoRate {
        /// The payment's currency.
        currency: String,
    },
}

/// The amount in cents of the ledger's currency. Only the ledger's own
/// currency has a rate here; the FX service "fails" for the others.
///
/// ```
/// use inbox_examples::brokers::ledger::{ledger_cents, PaymentBody};
/// let eur = PaymentBody { account: 1, amount_cents: 99, currency: "EUR".into(), hold_ms: 0 };
/// assert_eq!(ledger_cents(&eur).unwrap(), 99);
/// let xts = PaymentBody { currency: "XTS".into(), ..eur };
/// assert!(ledger_cents(&xts).is_err());
/// ```
pub fn ledger_cents(body: &PaymentBody) -> Result<i64, LedgerError> {
    if body.currency == LEDGER_CURRENCY {
        Ok(body.amount_cents)
    } else {
        Err(LedgerError::NoRate {
            currency: body.currency.clone(),
        })
    }
}

/// Applies one payment, once: credits the account and writes the ledger
/// entry, in one transaction that first claims the payment's id.
///
/// - a redelivery (or a second copy) of an applied payment returns
///   `Ok(Outcome::Duplicate)` without running the body;
/// - a payment to an account that does not exist is **rejected**
///   ([`InboxError::rejected`]): dead at once;
/// - a payment whose currency has no rate fails the attempt
///   ([`LedgerError::NoRate`]): redelivered, and dead after three failed
///   attempts ([`InboxError::AttemptsExhausted`]);
/// - a database failure rolls everything back, claim included, and is not
///   counted as an attempt: the redelivery is processed;
/// - a slow payment ([`PaymentBody::hold_ms`]) keeps its claim uncommitted
///   while it runs: a copy delivered meanwhile waits for it up to the
///   claim wait (the process default, 2 s) and is then answered
///   [`InboxError::InProgress`], redelivered later.
///
/// The payment's receipt (a [`Receipt`], for the next service) is
/// recorded in the same transaction, through the outbox
/// ([`inbox_runtime::outbox`]): it exists if and only if the payment was
/// applied, once, and a relay publishes it after the commit.
///
/// `probe` is called inside the transaction, between the balance update
/// (and the receipt) and the ledger entry: a no-op in the examples, a
/// place to stop in the chaos tests (which kill the process there).
#[idempotent(id = payment.id, handler = "ledger.apply_payment", max_attempts = 3)]
pub async fn apply_payment<P: Probe>(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    probe: &P,
) -> Result<Outcome<()>, LedgerError> {
    let cents = ledger_cents(&payment.body)?;
    credit(conn, payment, cents).await?;
    outbox::send_async(conn, &Receipt::of(payment, cents).message()).await?;
    probe.in_transaction(&payment.id).await;
    hold(payment).await;
    record_entry(conn, payment, cents).await?;
    Ok(Outcome::Processed(()))
}

/// Adds `cents` to the payment's account; a payment to an account that
/// does not exist is rejected ([`InboxError::Rejected`]: dead at once, not
/// retried).
pub async fn credit(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    cents: i64,
) -> Result<(), LedgerError> {
    let credited = diesel::update(ledger_accounts::table.find(payment.body.account))
        .set(ledger_accounts::balance_cents.eq(ledger_accounts::balance_cents + cents))
        .execute(conn)
        .await?;
    if credited == 0 {
        return Err(InboxError::rejected(format!(
            "account {} does not exist",
            payment.body.account
        ))
        .into());
    }
    Ok(())
}

/// Keeps a slow payment's transaction open for its
/// [`PaymentBody::hold_ms`].
pub async fn hold(payment: &Payment) {
    if payment.body.hold_ms > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(payment.body.hold_ms)).await;
    }
}

/// The payment's ledger entry. The table has no unique key on the message
/// id, so a payment applied twice shows as two entries (what the chaos
/// runs' check counts).
pub async fn record_entry(
    conn: &mut AsyncPgConnection,
    payment: &Payment,
    cents: i64,
) -> diesel::QueryResult<usize> {
    diesel::insert_into(ledger_entries::table)
        .values((
            ledger_entries::message_id.eq(&payment.id),
            ledger_entries::account_id.eq(payment.body.account),
            ledger_entries::amount_cents.eq(cents),
        ))
        .execute(conn)
        .await
}

/// Whether the inbox holds `message_id` as dead for [`HANDLER`].
///
/// A duplicate delivery of a dead message is acknowledged by
/// `ack_decision` (`Ok(Outcome::Duplicate)`), but its copy belongs in the
/// dead-letter queue: when a consumer dies after the inbox recorded the
/// message as dead and before it dead-lettered the delivery, the
/// redelivery is the only copy left, and acknowledging it would lose the
/// payload that an operator replays after `dead_letters::revive`. One
/// primary-key lookup, made only for duplicates.
pub async fn is_dead(conn: &mut AsyncPgConnection, message_id: &str) -> diesel::QueryResult<bool> {
    diesel::select(diesel::dsl::exists(
        inbox_failures::table
            .filter(inbox_failures::handler.eq(HANDLER))
            .filter(inbox_failures::message_id.eq(message_id))
            .filter(inbox_failures::dead_at.is_not_null()),
    ))
    .get_result(conn)
    .await
}

/// The ledger's database: a PostgreSQL URL whose connections use the
/// ledger's schema.
#[derive(Debug, Clone)]
pub struct LedgerDb {
    url: String,
}

impl LedgerDb {
    /// The database at `url` (its connections' `search_path` chooses the
    /// schema: see [`LedgerDb::with_schema`]).
    pub fn new(url: impl Into<String>) -> Self {
        LedgerDb { url: url.into() }
    }

    /// The database at `server_url`, in `schema`: its connections set
    /// `search_path` to it.
    ///
    /// ```
    /// use inbox_examples::brokers::ledger::LedgerDb;
    /// let db = LedgerDb::with_schema("postgres://postgres@127.0.0.1/test", "ledger_1");
    /// assert_eq!(db.url(), "postgres://postgres@127.0.0.1/test?options=-csearch_path%3Dledger_1");
    /// ```
    pub fn with_schema(server_url: &str, schema: &str) -> Self {
        LedgerDb::new(format!(
            "{server_url}{}options=-csearch_path%3D{schema}",
            separator(server_url)
        ))
    }

    /// The URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL with `application_name` set, so that the server lists the
    /// connections under that name (`pg_stat_activity`).
    pub fn tagged_url(&self, application_name: &str) -> String {
        format!(
            "{}{}application_name={application_name}",
            self.url,
            separator(&self.url)
        )
    }

    /// A blocking connection (setup and checks).
    pub fn connect(&self) -> Result<PgConnection, BoxError> {
        Ok(PgConnection::establish(&self.url)?)
    }

    /// Creates the ledger's tables and the inbox's (idempotent), and the
    /// accounts `1..=accounts` with a zero balance.
    pub fn prepare(&self, accounts: i64) -> Result<(), BoxError> {
        let mut conn = self.connect()?;
        inbox_runtime::setup(&mut conn)?;
        conn.batch_execute(SCHEMA_SQL)?;
        conn.batch_execute(&format!(
            "INSERT INTO ledger_accounts (id) SELECT generate_series(1, {accounts}) ON CONFLICT DO NOTHING"
        ))?;
        Ok(())
    }

    /// A pool of at most `size` connections, listed by the server under
    /// `application_name`. deadpool checks a connection before it hands it
    /// out again (diesel-async's `Verified` recycling), so a connection the
    /// server ended is replaced, not reused.
    pub fn pool(&self, application_name: &str, size: usize) -> Result<Pool, BoxError> {
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(
            self.tagged_url(application_name),
        );
        Ok(deadpool::Pool::builder(manager).max_size(size).build()?)
    }
}

fn separator(url: &str) -> char {
    if url.contains('?') {
        '&'
    } else {
        '?'
    }
}
