//! Statements a handler's body leaves to be sent with its commit, in the
//! commit's own round trip: what keeps an outgoing message from costing a
//! delivery one more round trip (see `outbox::send`).
//!
//! A delivery that opens the outermost transaction collects them while its
//! body is polled. A statement is collected only when issued on that
//! delivery's connection at the depth of its transaction: inside a
//! savepoint the body opened, which may roll back on its own while the
//! handler commits, it must run at once. Whatever was collected is
//! prepended to the `COMMIT` (and sent only on a commit: a rollback, a
//! failed body or a panic drops it with the rest of the transaction).

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::pin::pin;

use super::executor::Executor;
use crate::execution::depth;
use crate::execution::installed::Installed;

/// The most text a delivery collects for its commit: beyond it, a
/// statement runs at once (a commit's text must stay well inside what a
/// server takes in one packet: MariaDB's `max_allowed_packet` is 16 MiB by
/// default, and a message's bytes are written twice over in hex).
const MAX_COLLECTED_BYTES: usize = 1024 * 1024;

thread_local! {
    static COLLECTING: RefCell<Option<Collector>> = const { RefCell::new(None) };
}

/// Where a delivery's body may defer: its connection, at the depth of its
/// transaction.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CollectAt {
    /// The address of the delivery's connection.
    conn: usize,
    /// The depth of its transaction.
    depth: u32,
}

impl CollectAt {
    /// `exec`'s connection at its current depth (the delivery's level,
    /// just begun).
    pub(crate) fn level<X: Executor>(exec: &mut X) -> Self {
        let depth = depth(exec.status()).unwrap_or(0);
        CollectAt {
            conn: address(exec),
            depth,
        }
    }

    /// A collector there, with nothing collected yet (no allocation).
    pub(crate) fn collector(self) -> Collector {
        Collector {
            at: self,
            sql: String::new(),
        }
    }
}

/// What a delivery's body deferred so far, and where it may defer.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    at: CollectAt,
    /// The statements, each ending with `;`.
    sql: String,
}

impl Collector {
    /// The statements collected (empty when none), each ending with `;`.
    pub(crate) fn into_sql(self) -> String {
        self.sql
    }
}

/// Collects the statement `text` builds to be sent with the commit of the
/// delivery running on `exec`'s connection, when the body issued it there
/// at the depth of the delivery's transaction, `text` gives one (the
/// backend can send it that way) and the commit's text stays within
/// [`MAX_COLLECTED_BYTES`]: `true` then. `false`: run it now.
pub(crate) fn defer<X: Executor>(exec: &mut X, text: impl FnOnce() -> Option<String>) -> bool {
    let conn = address(exec);
    let Ok(now) = depth(exec.status()) else {
        return false;
    };
    COLLECTING.with(|collecting| {
        let mut collecting = collecting.borrow_mut();
        let Some(collector) = collecting
            .as_mut()
            .filter(|collector| collector.at.conn == conn && collector.at.depth == now && now > 0)
        else {
            return false;
        };
        let Some(statement) = text() else {
            return false;
        };
        if collector.sql.len() + statement.len() > MAX_COLLECTED_BYTES {
            return false;
        }
        collector.sql.push_str(&statement);
        collector.sql.push_str("; ");
        true
    })
}

/// `body`, with `collector` collecting while it is polled (a blocking body
/// runs in its first poll, an async one across its polls, perhaps on
/// several threads; `None`: nothing is collected, not even by a delivery
/// around this one): its output, and what was collected.
pub(crate) async fn collecting<F: Future>(
    collector: Option<Collector>,
    body: F,
) -> (F::Output, Collector) {
    let mut body = pin!(body);
    let mut collector = collector;
    let output = poll_fn(|cx| {
        let installed = Installed::new(&COLLECTING, collector.take());
        let poll = body.as_mut().poll(cx);
        collector = installed.take();
        poll
    })
    .await;
    (output, collector.unwrap_or_default())
}

/// The address of `exec`'s connection: what tells the delivery's own
/// connection from another one the body uses.
fn address<X: Executor>(exec: &mut X) -> usize {
    std::ptr::from_mut(exec.conn()) as usize
}
