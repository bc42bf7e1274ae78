//! The one retry policy of the runtime: which failures are tried again (a
//! lock conflict, [`is_lock_conflict`]), how many tries in all, and the wait
//! between them. A claim and a pruning batch, blocking or async, count their
//! tries the same way: the first one included.

use std::time::Duration;

use diesel::result::Error;

use crate::recovery::is_lock_conflict;

/// How many times in all a handler's transaction is attempted when its claim
/// loses a lock conflict (see [`run_idempotent`](crate::run_idempotent)).
///
/// ```
/// assert_eq!(inbox_runtime::CLAIM_ATTEMPTS, 5);
/// ```
pub const CLAIM_ATTEMPTS: u32 = 5;

/// How many times a pruning batch is tried when it keeps losing lock
/// conflicts before the run gives up.
const BATCH_ATTEMPTS: u32 = 4;

/// When a transaction that lost a lock conflict (which the database
/// resolved by rolling it back whole) is run again from the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Tries in all, the first included.
    attempts: u32,
    /// The wait after the n-th failed try is n times this.
    step: Duration,
}

impl RetryPolicy {
    /// A handler's claim: [`CLAIM_ATTEMPTS`] tries, back to back (the body
    /// has not run yet, and the conflicting delivery has just ended).
    pub(crate) const CLAIM: RetryPolicy = RetryPolicy {
        attempts: CLAIM_ATTEMPTS,
        step: Duration::ZERO,
    };

    /// A pruning batch: four tries, 10 ms, 20 ms, 30 ms apart.
    pub(crate) const BATCH: RetryPolicy = RetryPolicy {
        attempts: BATCH_ATTEMPTS,
        step: Duration::from_millis(10),
    };

    /// A relay's lease (its short transaction, or its one statement) and
    /// each of its records of what the broker answered, where it runs on
    /// its own: tried as a pruning batch is. A record that fails for good
    /// leaves a published message to be published again.
    pub(crate) const RELAY: RetryPolicy = RetryPolicy::BATCH;

    /// A statement inside a transaction that a lock conflict rolls back
    /// whole: not tried again on its own (the transaction's caller decides).
    pub(crate) const ONCE: RetryPolicy = RetryPolicy {
        attempts: 1,
        step: Duration::ZERO,
    };

    /// The tries of one transaction, the first one under way.
    pub(crate) fn tries(self) -> Tries {
        Tries {
            policy: self,
            made: 1,
        }
    }
}

/// The tries made so far of one transaction under a [`RetryPolicy`].
#[derive(Debug)]
pub(crate) struct Tries {
    policy: RetryPolicy,
    made: u32,
}

impl Tries {
    /// The latest try failed with `error`: the wait before the next one, or
    /// `None` when the error stands (not a lock conflict, or no tries left).
    pub(crate) fn again(&mut self, error: &Error) -> Option<Duration> {
        if self.made >= self.policy.attempts || !is_lock_conflict(error) {
            return None;
        }
        let wait = self.policy.step * self.made;
        self.made += 1;
        Some(wait)
    }

    /// The tries made so far, the first included.
    pub(crate) fn made(&self) -> u32 {
        self.made
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::result::DatabaseErrorKind;

    fn deadlock() -> Error {
        Error::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new(
                "Deadlock found when trying to get lock; try restarting transaction".to_owned(),
            ),
        )
    }

    #[test]
    fn claims_retry_lock_conflicts_a_bounded_number_of_times() {
        let mut tries = RetryPolicy::CLAIM.tries();
        for _ in 1..CLAIM_ATTEMPTS {
            assert_eq!(tries.again(&deadlock()), Some(Duration::ZERO));
        }
        assert_eq!(
            tries.again(&deadlock()),
            None,
            "{CLAIM_ATTEMPTS} tries in all"
        );
        assert_eq!(RetryPolicy::CLAIM.tries().again(&Error::NotFound), None);
    }

    #[test]
    fn once_is_one_try() {
        assert_eq!(RetryPolicy::ONCE.tries().again(&deadlock()), None);
    }

    #[test]
    fn batches_retry_lock_conflicts_with_a_growing_wait() {
        let mut tries = RetryPolicy::BATCH.tries();
        let waits: Vec<_> = std::iter::from_fn(|| tries.again(&deadlock())).collect();
        let ms = Duration::from_millis;
        assert_eq!(waits, [ms(10), ms(20), ms(30)], "four tries in all");
        assert_eq!(RetryPolicy::BATCH.tries().again(&Error::NotFound), None);
    }
}
