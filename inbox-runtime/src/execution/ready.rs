//! Driving, without a runtime, a future all of whose awaits are ready at
//! once: how the blocking front ends run logic written once as an `async
//! fn` (a delivery, the batch split, the pruning driver) over steps that
//! execute when they are called.

use std::future::{Future, poll_fn};
use std::panic::{self, AssertUnwindSafe};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Runs `future` on the calling thread, in one poll.
///
/// Panics if the future is not ready at its first poll: a blocking step
/// never waits on anything. The blocking executors' steps return
/// [`std::future::Ready`], and a blocking body is a closure called inside
/// an `async` block that does not await, so every future they compose is
/// ready at its first poll.
pub(crate) fn block_ready<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("a blocking run never waits on a future"),
    }
}

/// `future`, with a panic in any of its polls caught and returned as
/// `Err` (a handler body's panic, rolled back before it is resumed). The
/// same watch for a blocking body (a closure run in the future's first
/// poll) and an async one.
pub(crate) async fn caught<F: Future>(future: F) -> std::thread::Result<F::Output> {
    let mut future = pin!(future);
    poll_fn(
        |cx| match panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        },
    )
    .await
}
