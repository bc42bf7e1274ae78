//! The batch variants: `n` messages delivered through
//! `inbox_runtime::run_idempotent_batch`, one transaction per batch (one
//! claim statement for all ids, then the effect once per new message).

use inbox_runtime::HandlerName;

use crate::connections::BenchConnection;

/// Whether this build has the batch API.
pub const AVAILABLE: bool = false;

/// Delivers `ids` as one batch, each message's effect on `account`.
pub fn deliver<C: BenchConnection>(
    _conn: &mut C,
    _handler: &HandlerName,
    _ids: &[u64],
    _account: i64,
) {
    // TODO: `inbox_runtime::run_idempotent_batch` is not in this build yet:
    // let report = inbox_runtime::run_idempotent_batch(conn, handler, ids, |id| id, |conn, _id| {
    //     conn.effect(account)
    // });
    // for result in report.iter() {
    //     result.as_ref().expect("a batch delivery");
    // }
    unreachable!("the batch variants are skipped without the batch API")
}
