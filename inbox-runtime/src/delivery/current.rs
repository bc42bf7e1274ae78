//! Which message's body a batch is running on this thread, so that a
//! handler called inside it for the same message (an `#[idempotent]`
//! function used as the batch's body) runs instead of taking the batch's
//! own claim for a duplicate.
//!
//! The batch claims every id before any body runs, so a nested handler of
//! the same scope finds its id claimed — by the transaction it runs in. Seen
//! as a duplicate, its body would be skipped and the message acknowledged
//! with no effect. Only the messages whose body is running are marked (one,
//! or all that a bulk body handles): a handler called for another id of the
//! batch still sees a duplicate (that message's own body runs it).

use std::cell::RefCell;
use std::future::Future;

use crate::execution::installed::polled_with;
use crate::key::ClaimKey;

thread_local! {
    static RUNNING: RefCell<Vec<ClaimKey>> = const { RefCell::new(Vec::new()) };
}

/// Whether a claim of `key` that found it claimed, in a transaction level
/// nested in the caller's, found the claim of the batch whose body for this
/// very message is running: then the nested handler's body runs.
pub(crate) fn is_running(key: &ClaimKey) -> bool {
    RUNNING.with(|running| running.borrow().iter().any(|marked| marked.same_claim(key)))
}

/// `body`, with `keys` marked as the messages whose body runs (one, or
/// every message a bulk body handles) while it is polled: a blocking body
/// runs in its first poll, an async one across its polls.
pub(crate) fn running<'k, F: Future>(
    keys: impl IntoIterator<Item = &'k ClaimKey>,
    body: F,
) -> impl Future<Output = F::Output> {
    let keys: Vec<ClaimKey> = keys.into_iter().cloned().collect();
    polled_with(&RUNNING, keys, body)
}
