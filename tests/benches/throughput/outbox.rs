//! What recording an outgoing message costs a handler: `outbox` is
//! `handler` whose body, after its effect, also records one outgoing
//! message of 128 bytes with two headers through `outbox::send` (one
//! `INSERT` into `inbox_outbox` in the handler's transaction; on async
//! connections `outbox::send_async` in an `#[idempotent]` handler written
//! for the connection's type, as `handler` is there); `outbox-keyed` gives it an ordering key (the worker's
//! account, so that the workers never wait on one another's key), which
//! numbers it through the key's counter row (`inbox_outbox_keys`) in the
//! same statement. Compare both with `handler` within one run
//! (`INBOX_BENCH_VARIANTS=handler,outbox,outbox-keyed`). The outbox grows
//! during the run: no relay drains it.

use inbox_runtime::outbox::{self, OutgoingMessage};
use inbox_runtime::run_idempotent;

use super::connections::BenchConnection;
use super::{Variant, Worker, fresh_ids, key};

/// The payload of every outgoing message.
const PAYLOAD: [u8; 128] = [b'x'; 128];

/// The message an outbox `variant`'s delivery records for `account`.
pub(super) fn bench_message(variant: Variant, account: i64) -> OutgoingMessage {
    let message = OutgoingMessage::new("bench.receipts", &PAYLOAD[..])
        .header("content-type", "application/octet-stream")
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
    match variant {
        Variant::Outbox => message,
        Variant::OutboxKeyed => message.ordering_key(account.to_string()),
        other => unreachable!("{} is not an outbox variant", other.name()),
    }
}

impl<C: BenchConnection> Worker<C> {
    /// One delivery of an outbox variant.
    pub(super) fn deliver_outbox(&mut self, variant: Variant) {
        let account = self.account;
        let message = bench_message(variant, account);
        run_idempotent(
            &mut self.conn,
            key(&self.handler, fresh_ids(1)),
            |conn: &mut C| {
                conn.effect(account)?;
                outbox::send(conn, &message)?;
                Ok::<(), inbox_runtime::InboxError>(())
            },
        )
        .expect("outbox");
    }
}
