//! The payments: their table, the request body and its validation, and the
//! `#[idempotent]` handler that creates a payment and returns the response
//! stored with the idempotency key.

use std::time::Duration;

use diesel::prelude::*;
use diesel::PgConnection;
use inbox_runtime::{idempotent, ClaimWait, InboxError, StoredOutcome};
use serde::{Deserialize, Serialize};

/// The handler's deduplication scope, as written in its attribute: the
/// idempotency keys of `POST /payments` live under this name in
/// `inbox_messages`, apart from any other endpoint's.
pub const HANDLER: &str = "http.create_payment";

/// The payments table. No unique constraint on `idempotency_key` on
/// purpose: a payment created twice for one key would show up as two rows,
/// which the tests count.
pub const SCHEMA_SQL: &str = "\
CREATE TABLE IF NOT EXISTS http_payments (
    id              BIGSERIAL PRIMARY KEY,
    idempotency_key TEXT   NOT NULL,
    account         TEXT   NOT NULL,
    amount_cents    BIGINT NOT NULL CHECK (amount_cents > 0),
    currency        TEXT   NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);";

diesel::table! {
    /// One row per payment created.
    http_payments (id) {
        /// The payment's id, returned to the client.
        id -> BigInt,
        /// The `Idempotency-Key` of the request that created it.
        idempotency_key -> Text,
        /// The account charged.
        account -> Text,
        /// The amount, in cents of `currency`.
        amount_cents -> BigInt,
        /// ISO 4217 code.
        currency -> Text,
    }
}

/// The largest amount a payment may have, in cents.
pub const MAX_AMOUNT_CENTS: i64 = 100_000_000;

/// The body of `POST /payments`, as JSON:
/// `{"account": "acc-1", "amount_cents": 250, "currency": "EUR"}`.
///
/// ```
/// use inbox_examples::http::payments::NewPayment;
/// let payment = NewPayment::parse(br#"{"account":"acc-1","amount_cents":250,"currency":"EUR"}"#).unwrap();
/// assert_eq!(payment.amount_cents, 250);
/// assert_eq!(NewPayment::parse(b"{").unwrap_err().status, 400);
/// assert_eq!(NewPayment::parse(br#"{"account":"a","amount_cents":-5,"currency":"EUR"}"#).unwrap_err().status, 422);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewPayment {
    /// The account to charge: 1 to 64 characters.
    pub account: String,
    /// The amount in cents: from 1 to [`MAX_AMOUNT_CENTS`].
    pub amount_cents: i64,
    /// Three uppercase letters (ISO 4217).
    pub currency: String,
}

/// Why a request body was refused before anything was claimed or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidBody {
    /// 400 for a body that is not the JSON object expected (syntax, types,
    /// missing or unknown fields), 422 for well-formed values the service
    /// refuses (a negative amount, a currency that is not three letters).
    pub status: u16,
    /// What is wrong, for the problem's `detail`.
    pub detail: String,
}

impl NewPayment {
    /// Reads and validates a request body.
    pub fn parse(body: &[u8]) -> Result<NewPayment, InvalidBody> {
        let payment: NewPayment = serde_json::from_slice(body).map_err(|error| InvalidBody {
            status: 400,
            detail: format!("the body is not a payment request: {error}"),
        })?;
        let refuse = |detail: String| {
            Err(InvalidBody {
                status: 422,
                detail,
            })
        };
        if payment.account.is_empty() || payment.account.chars().count() > 64 {
            return refuse("`account` must be 1 to 64 characters".to_owned());
        }
        if !(1..=MAX_AMOUNT_CENTS).contains(&payment.amount_cents) {
            return refuse(format!(
                "`amount_cents` must be from 1 to {MAX_AMOUNT_CENTS}, not {}",
                payment.amount_cents
            ));
        }
        if payment.currency.len() != 3 || !payment.currency.bytes().all(|b| b.is_ascii_uppercase())
        {
            return refuse(format!(
                "`currency` must be three uppercase letters (ISO 4217), not {:?}",
                payment.currency
            ));
        }
        Ok(payment)
    }
}

/// A created payment, as the response's body shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// The payment's id.
    pub id: i64,
    /// The account charged.
    pub account: String,
    /// The amount, in cents.
    pub amount_cents: i64,
    /// The currency.
    pub currency: String,
}

/// The HTTP response stored with the idempotency key's claim, and sent
/// again, byte for byte, to every retry of the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// The JSON body, as sent.
    pub body: String,
}

/// One request to create a payment, as the handler receives it.
#[derive(Debug, Clone)]
pub struct CreatePayment {
    /// The `Idempotency-Key`: the message id the inbox deduplicates on.
    pub key: String,
    /// The raw request body: its fingerprint is stored with the key, and a
    /// request that reuses the key with other bytes is refused.
    pub body: Vec<u8>,
    /// The body, parsed and validated.
    pub payment: NewPayment,
    /// How long the body keeps its transaction open after the insert: zero
    /// in production; it stands for slower work inside the transaction, and
    /// the tests use it to keep a request in flight (see
    /// [`Config::hold`](super::Config::hold)).
    pub hold: Duration,
    /// How long the claim waits for a request with the same key still in
    /// flight before the request is answered `409` (see
    /// [`Config::claim_wait`](super::Config::claim_wait)).
    pub claim_wait: ClaimWait,
}

/// What creating a payment can fail with. Nothing is committed on any of
/// them: the key stays free, and the same request may be sent again.
#[derive(Debug, thiserror::Error)]
pub enum PaymentError {
    /// A statement of the body failed.
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
    /// The inbox's own error: an invalid key, a key reused with another
    /// payload, a claim that waited too long on a request in flight.
    #[error(transparent)]
    Inbox(#[from] InboxError),
}

/// Creates the payment once per `Idempotency-Key`, in one transaction
/// that first claims the key with the body's fingerprint, and stores the
/// response with the claim. A retry with the same key and body gets
/// `StoredOutcome::Replayed` with that response; one with another body gets
/// `InboxError::Conflict`; neither runs the body.
#[idempotent(
    id = req.key,
    handler = "http.create_payment",
    fingerprint = req.body,
    store_result,
    max_attempts = unbounded,
    claim_wait = req.claim_wait
)]
pub fn create_payment(
    conn: &mut PgConnection,
    req: &CreatePayment,
) -> Result<StoredOutcome<StoredResponse>, PaymentError> {
    let new = &req.payment;
    let id: i64 = diesel::insert_into(http_payments::table)
        .values((
            http_payments::idempotency_key.eq(&req.key),
            http_payments::account.eq(&new.account),
            http_payments::amount_cents.eq(new.amount_cents),
            http_payments::currency.eq(&new.currency),
        ))
        .returning(http_payments::id)
        .get_result(conn)?;
    std::thread::sleep(req.hold);
    let payment = Payment {
        id,
        account: new.account.clone(),
        amount_cents: new.amount_cents,
        currency: new.currency.clone(),
    };
    Ok(StoredOutcome::Processed(StoredResponse {
        status: 201,
        body: serde_json::to_string(&payment).expect("a payment serialises"),
    }))
}
