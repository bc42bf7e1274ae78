//! The blocking batch variants: `n` messages delivered through
//! `inbox_runtime::run_idempotent_batch`, one transaction per batch (one
//! claim statement for all ids, then the effect once per new message). The
//! async ones are in `nonblocking.rs`.

use inbox_runtime::{HandlerName, run_idempotent_batch, run_idempotent_batch_bulk};

use crate::connections::BenchConnection;

/// Delivers `ids` as one batch, each message's effect on `account`.
pub fn deliver<C: BenchConnection>(conn: &mut C, handler: &HandlerName, ids: &[u64], account: i64) {
    let report = run_idempotent_batch(
        conn,
        handler,
        ids,
        |id| id,
        |conn: &mut C, _id| conn.effect(account),
    );
    if let Some(Err(error)) = report.results().iter().find(|result| result.is_err()) {
        panic!("a batch delivery failed: {error}");
    }
}

/// Delivers `ids` as one batch with one body for the new messages: one
/// `UPDATE` of `account` adding their count.
pub fn deliver_bulk<C: BenchConnection>(
    conn: &mut C,
    handler: &HandlerName,
    ids: &[u64],
    account: i64,
) {
    let report = run_idempotent_batch_bulk(
        conn,
        handler,
        ids,
        |id| id,
        |conn: &mut C, new| conn.effect_by(account, new.len() as i64).map(drop),
    );
    if let Some(Err(error)) = report.results().iter().find(|result| result.is_err()) {
        panic!("a bulk batch delivery failed: {error}");
    }
}
