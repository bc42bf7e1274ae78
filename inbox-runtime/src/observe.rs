//! What the runtime reports about its work: the one place the runners and
//! the pruner call to be observed. Without the `tracing` and `metrics`
//! features every function here is empty and inlined away.

use std::time::{Duration, Instant};

use crate::key::ClaimKey;

/// How a delivery ended, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The body ran and its effects committed.
    Processed,
    /// The id was already claimed: the body did not run.
    Duplicate,
    /// The body failed (or panicked); `attempts` is the failed-attempt count
    /// recorded for the message, when it was recorded.
    Failed { attempts: Option<u32> },
    /// The body rejected the message; it is recorded as dead.
    Rejected,
    /// The attempt that exhausted the message's attempts; it is recorded as
    /// dead.
    Dead { attempts: u32 },
    /// The message id is invalid: nothing ran.
    InvalidId,
    /// The inbox's own database work failed (claim, commit, rollback).
    DatabaseError,
}

/// One delivery being handled, from before the claim to its end.
#[derive(Debug)]
pub(crate) struct Delivery {
    started: Instant,
    claim_wait: Option<Duration>,
}

impl Delivery {
    /// A delivery of `key` starts.
    #[inline]
    pub(crate) fn start(key: &ClaimKey) -> Delivery {
        let _ = key;
        Delivery {
            started: Instant::now(),
            claim_wait: None,
        }
    }

    /// A claim lost a lock conflict and is tried again (`tries`: the tries
    /// made so far, the first included).
    #[inline]
    pub(crate) fn claim_retry(&self, tries: u32, error: &diesel::result::Error) {
        let _ = (tries, error);
    }

    /// The claim finished (claimed or duplicate).
    #[inline]
    pub(crate) fn claimed(&mut self) {
        self.claim_wait = Some(self.started.elapsed());
    }

    /// The delivery ended.
    #[inline]
    pub(crate) fn finish(self, ending: Ending) {
        let _ = (ending, self.claim_wait);
    }
}

/// How a delivery that failed with the inbox's own `error` ended.
pub(crate) fn ending_of_inbox_error(error: &crate::InboxError) -> Ending {
    match error {
        crate::InboxError::InvalidMessageId { .. } => Ending::InvalidId,
        _ => Ending::DatabaseError,
    }
}

/// A pruning batch deleted `rows` rows of `table` (`inbox_messages` or
/// `inbox_failures`); `handler` when the batch pruned one handler only.
#[inline]
pub(crate) fn pruned(table: &'static str, handler: Option<&str>, rows: u64) {
    let _ = (table, handler, rows);
}
