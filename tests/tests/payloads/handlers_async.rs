//! The async (diesel-async) twins of `transfer` and `charge`.

use std::sync::atomic::Ordering;

use diesel_async::{AsyncConnection, RunQueryDsl};
use inbox_runtime::{InboxBackend, Outcome, StoredOutcome, idempotent};
use inbox_tests::{AppError, statement};

use crate::handlers::{Charge, PanickingReceipt, Receipt, Transfer};
use crate::support::literal;

/// `transfer`, async.
#[idempotent(id = msg.id, handler = "payloads.transfer", fingerprint = msg.body.as_bytes(), shared_scope)]
pub async fn transfer_async<C>(conn: &mut C, msg: &Transfer) -> Result<Outcome<()>, AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    msg.runs.fetch_add(1, Ordering::SeqCst);
    apply(conn, &msg.id, &msg.body).await?;
    tokio::time::sleep(msg.hold).await;
    Ok(Outcome::Processed(()))
}

/// `charge`, async.
#[idempotent(id = req.request_id, handler = "payloads.charge", fingerprint = req, store_result, shared_scope)]
pub async fn charge_async<C>(conn: &mut C, req: &Charge) -> Result<StoredOutcome<Receipt>, AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    req.runs.fetch_add(1, Ordering::SeqCst);
    apply(conn, &req.request_id, &req.amount.to_string()).await?;
    Ok(StoredOutcome::Processed(Receipt {
        request_id: req.request_id.clone(),
        amount: req.amount,
        note: "n".repeat(req.note_len),
    }))
}

async fn apply<C: AsyncConnection>(conn: &mut C, id: &str, body: &str) -> diesel::QueryResult<()> {
    statement(format!(
        "INSERT INTO payload_effects (message_id, body) VALUES ({}, {})",
        literal(id),
        literal(body)
    ))
    .execute(conn)
    .await
    .map(drop)
}

/// `panicking_receipt`, async.
#[idempotent(id = req.request_id, handler = "payloads.panicking_receipt", store_result, max_attempts = 2, shared_scope)]
pub async fn panicking_receipt_async<C>(
    conn: &mut C,
    req: &Charge,
) -> Result<StoredOutcome<PanickingReceipt>, AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    req.runs.fetch_add(1, Ordering::SeqCst);
    apply(conn, &req.request_id, &req.amount.to_string()).await?;
    Ok(StoredOutcome::Processed(PanickingReceipt))
}
