//! Driving, without a runtime, a future all of whose awaits are ready at
//! once: how the blocking front ends run logic written once as an `async
//! fn` (the pruning driver, the batch split) over steps that execute before
//! their futures are first polled.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Runs `future` on the calling thread, in one poll.
///
/// Panics if the future is not ready at its first poll: a blocking step
/// never waits on anything.
pub(crate) fn block_ready<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("a blocking run never waits on a future"),
    }
}
