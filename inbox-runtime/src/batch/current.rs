//! Which message's body a batch is running on this thread, so that a
//! handler called inside it for the same message (an `#[idempotent]`
//! function used as the batch's body) runs instead of taking the batch's
//! own claim for a duplicate.
//!
//! The batch claims every id before any body runs, so a nested handler of
//! the same scope finds its id claimed — by the transaction it runs in. Seen
//! as a duplicate, its body would be skipped and the message acknowledged
//! with no effect. Only the message whose body is running is marked: a
//! handler called for another id of the batch still sees a duplicate (that
//! message's own body runs it).

use std::cell::RefCell;
#[cfg(feature = "async")]
use std::future::Future;
#[cfg(feature = "async")]
use std::pin::Pin;
#[cfg(feature = "async")]
use std::task::{Context, Poll};

use crate::key::ClaimKey;

thread_local! {
    static RUNNING: RefCell<Option<ClaimKey>> = const { RefCell::new(None) };
}

/// Runs `body` with `key` marked as the message whose body runs.
pub(crate) fn running<R>(key: &ClaimKey, body: impl FnOnce() -> R) -> R {
    let _marked = Marked::new(key);
    body()
}

/// Whether a claim of `key` that found it claimed, in a transaction level
/// nested in the caller's, found the claim of the batch whose body for this
/// very message is running: then the nested handler's body runs.
pub(crate) fn is_running(key: &ClaimKey) -> bool {
    RUNNING.with(|running| running.borrow().as_ref() == Some(key))
}

/// `future`, with `key` marked while it is polled.
#[cfg(feature = "async")]
pub(crate) fn running_future<F: Future>(key: &ClaimKey, future: F) -> Running<F> {
    Running {
        key: key.clone(),
        future: Box::pin(future),
    }
}

/// A body's future, with its message marked while it is polled.
#[cfg(feature = "async")]
pub(crate) struct Running<F> {
    key: ClaimKey,
    future: Pin<Box<F>>,
}

#[cfg(feature = "async")]
impl<F: Future> Future for Running<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let _marked = Marked::new(&this.key);
        this.future.as_mut().poll(cx)
    }
}

/// Marks a message until dropped (also when its body panics), restoring
/// the mark it replaced.
struct Marked {
    previous: Option<ClaimKey>,
}

impl Marked {
    fn new(key: &ClaimKey) -> Self {
        let previous = RUNNING.with(|running| running.replace(Some(key.clone())));
        Marked { previous }
    }
}

impl Drop for Marked {
    fn drop(&mut self) {
        let previous = self.previous.take();
        RUNNING.with(|running| *running.borrow_mut() = previous);
    }
}
