//! The trace a delivery's body runs in: every message the body records
//! through the outbox continues it, unless the message names a trace of
//! its own. `#[idempotent(trace = …)]` runs its body in [`continuing`] (or
//! [`continuing_async`]); code without the attribute may call them itself.
//!
//! The trace is kept for the thread while the body runs: a blocking body
//! runs in one call, an async one across its polls (set again at each
//! poll, so a task that moves between threads keeps it).

use std::cell::RefCell;
use std::future::Future;

use super::trace::Trace;
use crate::execution::installed::{Installed, polled_with};

thread_local! {
    static CURRENT: RefCell<Option<Trace>> = const { RefCell::new(None) };
}

/// An incoming message's W3C trace context header (`traceparent`), as
/// `#[idempotent(trace = …)]`, [`continuing`] and [`continuing_async`]
/// take it: text (`&str`, `String`), or an `Option` of it for a header a
/// message may lack.
///
/// ```
/// use inbox_runtime::outbox::Traceparent;
///
/// let header: Option<String> = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
/// assert!(header.traceparent().is_some());
/// assert_eq!(None::<&str>.traceparent(), None);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `traceparent` header",
    label = "the incoming message's W3C `traceparent` header",
    note = "`trace = …` takes the header's text (`&str`, `String`) or an `Option` of it"
)]
pub trait Traceparent {
    /// The header's text, if there is one.
    fn traceparent(&self) -> Option<&str>;
}

impl Traceparent for str {
    fn traceparent(&self) -> Option<&str> {
        Some(self)
    }
}

impl Traceparent for String {
    fn traceparent(&self) -> Option<&str> {
        Some(self)
    }
}

impl<T: Traceparent + ?Sized> Traceparent for &T {
    fn traceparent(&self) -> Option<&str> {
        (**self).traceparent()
    }
}

impl<T: Traceparent> Traceparent for Option<T> {
    fn traceparent(&self) -> Option<&str> {
        self.as_ref().and_then(Traceparent::traceparent)
    }
}

/// Runs `body` in the trace `traceparent` names: every message it records
/// through the outbox ([`send`](super::send)) that names no trace of its
/// own ([`OutgoingMessage::continue_trace`](super::OutgoingMessage::continue_trace),
/// or a `traceparent` header) continues it, with a span of its own. A
/// missing or invalid header continues nothing.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::outbox::{self, OutgoingMessage};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// outbox::continuing(incoming, || {
///     conn.transaction(|conn| outbox::send(conn, &OutgoingMessage::new("receipts", "p-1")))
/// })?;
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn continuing<P, R>(traceparent: &P, body: impl FnOnce() -> R) -> R
where
    P: Traceparent + ?Sized,
{
    let _current = Installed::new(&CURRENT, parse(traceparent));
    body()
}

/// [`continuing`] for an async body: the trace is the thread's while the
/// body is polled.
///
/// ```
/// # async fn demo() {
/// let incoming = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// inbox_runtime::outbox::continuing_async(&incoming, async {
///     // outbox::send_async(conn, &message).await …
/// })
/// .await;
/// # }
/// ```
pub fn continuing_async<P, F>(traceparent: &P, body: F) -> impl Future<Output = F::Output>
where
    P: Traceparent + ?Sized,
    F: Future,
{
    polled_with(&CURRENT, parse(traceparent), body)
}

/// The trace the running body continues, if any.
pub(crate) fn current() -> Option<Trace> {
    CURRENT.with(|current| current.borrow().clone())
}

fn parse<P: Traceparent + ?Sized>(traceparent: &P) -> Option<Trace> {
    traceparent.traceparent().and_then(Trace::parse)
}
