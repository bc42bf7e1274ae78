//! The blocking handlers under test, written once with `#[idempotent]`,
//! generic over the connection. Each body records the payload it applied.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::prelude::*;
use inbox_runtime::{InboxBackend, Outcome, StoredOutcome, idempotent};
use inbox_tests::{AppError, statement};
use serde::{Deserialize, Serialize};

use crate::support::literal;

/// The handler names.
pub const TRANSFER: &str = "payloads.transfer";
pub const CHARGE: &str = "payloads.charge";

/// A delivery of message `id` carrying `body`; `runs` counts the bodies
/// that ran for it; the body sleeps `hold` before it returns (a race's
/// first delivery keeps its claim locked meanwhile).
#[derive(Debug)]
pub struct Transfer {
    pub id: String,
    pub body: String,
    pub hold: Duration,
    pub runs: AtomicU32,
}

impl Transfer {
    pub fn new(id: &str, body: &str) -> Self {
        Transfer {
            id: id.to_owned(),
            body: body.to_owned(),
            hold: Duration::ZERO,
            runs: AtomicU32::new(0),
        }
    }

    pub fn holding(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }

    pub fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

/// Applies the transfer's body; the body's bytes are the fingerprint.
#[idempotent(id = msg.id, handler = "payloads.transfer", fingerprint = msg.body.as_bytes(), shared_scope)]
pub fn transfer<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    msg: &Transfer,
) -> Result<Outcome<()>, AppError> {
    apply(conn, &msg.id, &msg.body, &msg.runs)?;
    std::thread::sleep(msg.hold);
    Ok(Outcome::Processed(()))
}

/// The same scope without a fingerprint: an older version of `transfer`.
#[idempotent(id = msg.id, handler = "payloads.transfer", shared_scope)]
pub fn transfer_unfingerprinted<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    msg: &Transfer,
) -> Result<Outcome<()>, AppError> {
    apply(conn, &msg.id, &msg.body, &msg.runs)?;
    Ok(Outcome::Processed(()))
}

/// Records one effect: the payload applied for message `id`.
pub fn apply<C: Connection>(
    conn: &mut C,
    id: &str,
    body: &str,
    runs: &AtomicU32,
) -> QueryResult<()> {
    runs.fetch_add(1, Ordering::SeqCst);
    statement(format!(
        "INSERT INTO payload_effects (message_id, body) VALUES ({}, {})",
        literal(id),
        literal(body)
    ))
    .execute(conn)
    .map(drop)
}

/// A request to charge `amount`; its JSON form is the fingerprint.
#[derive(Debug, Serialize)]
pub struct Charge {
    pub request_id: String,
    pub amount: u32,
    #[serde(skip)]
    pub runs: AtomicU32,
    /// How long the receipt's note is (to make it too large to store).
    #[serde(skip)]
    pub note_len: usize,
}

impl Charge {
    pub fn new(request_id: &str, amount: u32) -> Self {
        Charge {
            request_id: request_id.to_owned(),
            amount,
            runs: AtomicU32::new(0),
            note_len: 4,
        }
    }

    pub fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

/// What a charge returns, and a duplicate gets back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub request_id: String,
    pub amount: u32,
    pub note: String,
}

/// Charges once per request id; a retry gets the first receipt.
#[idempotent(id = req.request_id, handler = "payloads.charge", fingerprint = req, store_result, shared_scope)]
pub fn charge<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    req: &Charge,
) -> Result<StoredOutcome<Receipt>, AppError> {
    apply(conn, &req.request_id, &req.amount.to_string(), &req.runs)?;
    Ok(StoredOutcome::Processed(Receipt {
        request_id: req.request_id.clone(),
        amount: req.amount,
        note: "n".repeat(req.note_len),
    }))
}

/// The same scope, reading results back as another type: a later version
/// of `charge` whose receipt changed shape.
#[idempotent(id = req.request_id, handler = "payloads.charge", fingerprint = req, store_result, shared_scope)]
pub fn charge_reshaped<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    req: &Charge,
) -> Result<StoredOutcome<Vec<u64>>, AppError> {
    apply(conn, &req.request_id, "reshaped", &req.runs)?;
    Ok(StoredOutcome::Processed(vec![u64::from(req.amount)]))
}

/// The same scope without `store_result`: an older version of `charge`.
#[idempotent(id = req.request_id, handler = "payloads.charge", fingerprint = req, shared_scope)]
pub fn charge_unstored<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    req: &Charge,
) -> Result<(), AppError> {
    apply(conn, &req.request_id, &req.amount.to_string(), &req.runs)?;
    Ok(())
}

/// An order whose lines sit in a `HashMap`: its iteration order differs
/// between two maps with the same entries, its fingerprint must not.
#[derive(Debug, Serialize)]
pub struct Order {
    pub order_id: String,
    pub lines: HashMap<String, u32>,
    #[serde(skip)]
    pub runs: AtomicU32,
}

impl Order {
    pub fn new(order_id: &str, lines: &[(&str, u32)]) -> Self {
        Order {
            order_id: order_id.to_owned(),
            lines: lines
                .iter()
                .map(|(sku, quantity)| ((*sku).to_owned(), *quantity))
                .collect(),
            runs: AtomicU32::new(0),
        }
    }

    pub fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

/// Places an order; the whole order is the fingerprint.
#[idempotent(id = order.order_id, handler = "payloads.order", fingerprint = order)]
pub fn place<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    order: &Order,
) -> Result<Outcome<()>, AppError> {
    let total: u32 = order.lines.values().sum();
    apply(conn, &order.order_id, &total.to_string(), &order.runs)?;
    Ok(Outcome::Processed(()))
}

/// The same scope, failing after its effect.
#[idempotent(id = req.request_id, handler = "payloads.charge", fingerprint = req, store_result, shared_scope)]
pub fn failing_charge<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    req: &Charge,
) -> Result<StoredOutcome<Receipt>, AppError> {
    apply(conn, &req.request_id, "failed", &req.runs)?;
    Err(AppError::Failed("the payment provider is down"))
}

/// Stores its receipt, without a fingerprint (its claim statement is the
/// plain one, so only storing the result needs the new columns).
#[idempotent(id = req.request_id, handler = "payloads.receipt", store_result, max_attempts = 2, shared_scope)]
pub fn receipt_only<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    req: &Charge,
) -> Result<StoredOutcome<Receipt>, AppError> {
    apply(conn, &req.request_id, &req.amount.to_string(), &req.runs)?;
    Ok(StoredOutcome::Processed(Receipt {
        request_id: req.request_id.clone(),
        amount: req.amount,
        note: String::new(),
    }))
}

/// A receipt whose encoder panics: a `Serialize` of the user's with a bug.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PanickingReceipt;

impl Serialize for PanickingReceipt {
    fn serialize<S: serde::Serializer>(&self, _serializer: S) -> Result<S::Ok, S::Error> {
        panic!("the receipt's encoder panicked")
    }
}

/// The handler name of [`panicking_receipt`].
pub const PANICKING_RECEIPT: &str = "payloads.panicking_receipt";

/// Applies its effect, then returns a result whose encoding panics.
#[idempotent(id = req.request_id, handler = "payloads.panicking_receipt", store_result, max_attempts = 2, shared_scope)]
pub fn panicking_receipt<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    req: &Charge,
) -> Result<StoredOutcome<PanickingReceipt>, AppError> {
    apply(conn, &req.request_id, &req.amount.to_string(), &req.runs)?;
    Ok(StoredOutcome::Processed(PanickingReceipt))
}

/// Applies its effect, ignores a failed statement, and returns a receipt
/// to store: on PostgreSQL the transaction is aborted by then.
#[idempotent(id = req.request_id, handler = "payloads.receipt", store_result, shared_scope)]
pub fn charge_ignoring_a_failure<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    req: &Charge,
) -> Result<StoredOutcome<Receipt>, AppError> {
    apply(conn, &req.request_id, &req.amount.to_string(), &req.runs)?;
    let _ignored = statement("SELECT 1 / 0").execute(conn);
    Ok(StoredOutcome::Processed(Receipt {
        request_id: req.request_id.clone(),
        amount: req.amount,
        note: String::new(),
    }))
}
