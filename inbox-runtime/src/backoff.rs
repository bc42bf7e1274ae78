//! The one backoff policy of the inbox: how long to wait after failures in a
//! row before trying again. The background pruner waits by it between failed
//! runs; a consumer waits by it before reconnecting or redelivering.

use std::time::Duration;

/// Exponential backoff with a ceiling: `first` after one failure, doubling
/// with each further failure in a row, never more than `max`. Deterministic
/// (no jitter): add jitter of your own when many consumers restart at once.
///
/// ```
/// use std::time::Duration;
/// use inbox_runtime::Backoff;
///
/// let backoff = Backoff::DEFAULT;
/// assert_eq!(backoff.after(0), Duration::ZERO);
/// assert_eq!(backoff.after(1), Duration::from_millis(100));
/// assert_eq!(backoff.after(3), Duration::from_millis(400));
/// assert_eq!(backoff.after(100), Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Backoff {
    /// The wait after the first failure.
    pub first: Duration,
    /// The longest wait, however many failures in a row.
    pub max: Duration,
}

impl Backoff {
    /// 100 ms after the first failure, doubling up to 30 s.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::Backoff::DEFAULT.max.as_secs(), 30);
    /// ```
    pub const DEFAULT: Backoff = Backoff {
        first: Duration::from_millis(100),
        max: Duration::from_secs(30),
    };

    /// The wait after `failures` failures in a row (none after zero).
    ///
    /// ```
    /// use std::time::Duration;
    /// let backoff = inbox_runtime::Backoff { first: Duration::from_millis(10), max: Duration::from_millis(50) };
    /// assert_eq!(backoff.after(2), Duration::from_millis(20));
    /// assert_eq!(backoff.after(4), Duration::from_millis(50));
    /// ```
    pub fn after(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let factor = 1_u32.checked_shl(failures - 1).unwrap_or(u32::MAX);
        self.first.saturating_mul(factor).min(self.max)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::DEFAULT
    }
}
