//! What every path that runs SQL shares, blocking and async, handlers and
//! pruning alike: how deep the connection's transaction is ([`depth`]),
//! when a failed transaction is tried again ([`retry`]), when a failure
//! leaves the connection unusable ([`broken`]), and, on
//! diesel-async, what marks a connection broken when a future is dropped
//! inside a transaction ([`guard`]), and how a background worker waits for
//! its stop and run-now requests ([`signals`]), and what a body's code
//! finds in a thread-local slot while the body runs ([`installed`]).

pub(crate) mod broken;
pub(crate) mod depth;
#[cfg(feature = "async")]
pub(crate) mod guard;
pub(crate) mod installed;
pub(crate) mod ready;
pub(crate) mod retry;
pub(crate) mod signals;

pub(crate) use broken::leave_broken_if_unusable;
pub(crate) use depth::{depth, require_no_transaction, require_transaction};
#[cfg(feature = "async")]
pub(crate) use guard::OpenTransactionGuard;
pub(crate) use ready::{block_ready, caught};
pub use retry::CLAIM_ATTEMPTS;
pub(crate) use retry::RetryPolicy;
#[cfg_attr(not(any(feature = "r2d2", feature = "tokio")), allow(unused_imports))]
pub(crate) use signals::Signals;
#[cfg(all(feature = "postgres", any(feature = "r2d2", feature = "tokio")))]
pub(crate) use signals::Waited;
