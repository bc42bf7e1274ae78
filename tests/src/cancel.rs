//! Cancelling a future deterministically at one of its await points.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Drives a future for at most `polls` polls that return `Pending`, then
/// drops it: a deterministic cancellation at the `polls`-th await point that
/// really waited (on the database).
pub struct CancelAfter<F> {
    inner: Option<Pin<Box<F>>>,
    pending_left: usize,
}

impl<F: Future> CancelAfter<F> {
    /// `future`, to be dropped at its `polls`-th wait.
    pub fn new(future: F, polls: usize) -> Self {
        CancelAfter {
            inner: Some(Box::pin(future)),
            pending_left: polls,
        }
    }
}

impl<F: Future> Future for CancelAfter<F> {
    /// `None` when the future was cancelled.
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match inner.as_mut().poll(cx) {
            Poll::Ready(output) => Poll::Ready(Some(output)),
            Poll::Pending if this.pending_left == 0 => {
                this.inner = None; // drop it mid-flight
                Poll::Ready(None)
            }
            Poll::Pending => {
                this.pending_left -= 1;
                Poll::Pending
            }
        }
    }
}
