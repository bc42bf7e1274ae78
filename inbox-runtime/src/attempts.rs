//! How many failed deliveries a message gets before the inbox gives up on it.

use std::fmt;
use std::num::NonZeroU32;

/// How many times a handler's body may fail on one message before the inbox
/// records the message as dead and stops running the body for it.
///
/// A failed attempt is a delivery whose body returned `Err` (other than a
/// database failure, see below) or panicked, in a handler that opened its own
/// transaction. The count is written after the rollback, in a short
/// transaction of its own, so it survives the rollback of the attempt; it is
/// a **lower bound**: a process killed between the rollback and that write,
/// or a database that refuses the write, loses one count. Database trouble in
/// the body (a lock conflict, a lost connection: [`is_lock_conflict`] and
/// [`Recovery::Reconnect`]) says nothing about the message and is not
/// counted. Nested handlers (called inside a transaction the caller opened)
/// do not count: their caller's transaction is still open, and anything
/// written in it would roll back with it.
///
/// The attempt that reaches the limit returns
/// [`InboxError::AttemptsExhausted`], and the id is claimed as dead in the
/// same short transaction: later deliveries skip the body as duplicates, and
/// [`dead_letters`](crate::dead_letters) lists, revives and purges them.
///
/// The attribute takes `max_attempts = 3` or `max_attempts = unbounded`
/// ([`Options::max_attempts`](crate::Options::max_attempts) for the
/// functions); without it, a handler uses
/// [`default_max_attempts`](crate::default_max_attempts) (five unless
/// [`set_default_max_attempts`](crate::set_default_max_attempts) changed it).
///
/// ```
/// use inbox_runtime::MaxAttempts;
///
/// let three = MaxAttempts::limit(3);
/// assert!(!three.is_exhausted_after(2));
/// assert!(three.is_exhausted_after(3));
/// assert!(!MaxAttempts::Unbounded.is_exhausted_after(u32::MAX));
/// assert_eq!(MaxAttempts::DEFAULT, MaxAttempts::limit(5));
/// ```
///
/// [`is_lock_conflict`]: crate::is_lock_conflict
/// [`Recovery::Reconnect`]: crate::Recovery::Reconnect
/// [`InboxError::AttemptsExhausted`]: crate::InboxError::AttemptsExhausted
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MaxAttempts {
    /// The message is dead after this many failed attempts.
    Limit(NonZeroU32),
    /// Failed attempts are counted, but the message is never given up on:
    /// it is redelivered until it succeeds, is rejected, or an operator
    /// steps in.
    Unbounded,
}

impl MaxAttempts {
    /// The default limit: five failed attempts.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::MaxAttempts::DEFAULT.limit_value(), Some(5));
    /// ```
    pub const DEFAULT: MaxAttempts = MaxAttempts::limit(5);

    /// A limit of `attempts` failed attempts.
    ///
    /// # Panics
    /// When `attempts` is zero (a compile error in a `const`, and in the
    /// attribute): a message must get at least one attempt.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::MaxAttempts::limit(2).limit_value(), Some(2));
    /// ```
    pub const fn limit(attempts: u32) -> MaxAttempts {
        match NonZeroU32::new(attempts) {
            Some(attempts) => MaxAttempts::Limit(attempts),
            None => panic!("max_attempts must be at least 1"),
        }
    }

    /// The limit, or `None` when unbounded.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::MaxAttempts::Unbounded.limit_value(), None);
    /// ```
    pub const fn limit_value(self) -> Option<u32> {
        match self {
            MaxAttempts::Limit(attempts) => Some(attempts.get()),
            MaxAttempts::Unbounded => None,
        }
    }

    /// Whether a message that has failed `failed` times is dead.
    ///
    /// ```
    /// assert!(inbox_runtime::MaxAttempts::limit(1).is_exhausted_after(1));
    /// ```
    pub const fn is_exhausted_after(self, failed: u32) -> bool {
        match self {
            MaxAttempts::Limit(attempts) => failed >= attempts.get(),
            MaxAttempts::Unbounded => false,
        }
    }

    pub(crate) const fn encode(self) -> u32 {
        match self {
            MaxAttempts::Limit(attempts) => attempts.get(),
            MaxAttempts::Unbounded => 0,
        }
    }

    pub(crate) const fn decode(encoded: u32) -> MaxAttempts {
        match NonZeroU32::new(encoded) {
            Some(attempts) => MaxAttempts::Limit(attempts),
            None => MaxAttempts::Unbounded,
        }
    }
}

impl Default for MaxAttempts {
    fn default() -> Self {
        MaxAttempts::DEFAULT
    }
}

impl fmt::Display for MaxAttempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxAttempts::Limit(attempts) => write!(f, "{attempts}"),
            MaxAttempts::Unbounded => f.write_str("unbounded"),
        }
    }
}
