//! The delivery core: what happens to one message, or a batch's claims,
//! written once for blocking and async connections.
//!
//! The steps are `async fn`s over an [`Executor`](executor::Executor), the
//! one seam to a connection:
//!
//! - [`level`]: a transaction level begun, committed or rolled back (the
//!   rules for how a transaction ends);
//! - [`steps`]: the inbox's statements (the claim, a duplicate's stored
//!   fingerprint and result, a failed attempt's record);
//! - [`single`]: one message's delivery: claim with retries, the body,
//!   the end by its result;
//! - [`current`]: which batch message's body runs on this thread.
//!
//! [`blocking`] drives the core on the calling thread (its executor's steps
//! are ready when called, so one poll completes a delivery); `asynchronous`
//! (feature `async`) awaits it on diesel-async connections, and `pipelined`
//! on an `AsyncPgConnection` with its `BEGIN` sent in one flight with the
//! claim. The batch form
//! (`crate::batch`) runs its claims over the same executors.

pub(crate) mod blocking;
pub(crate) mod current;
pub(crate) mod deferred;
pub(crate) mod executor;
pub(crate) mod level;
pub(crate) mod single;
pub(crate) mod steps;

#[cfg(feature = "async")]
pub(crate) mod asynchronous;
#[cfg(all(feature = "async", feature = "postgres"))]
pub(crate) mod pipelined;
