//! How a delivery runs: every option of a delivery in one value
//! ([`Options`]), which `#[idempotent(...)]` builds from its arguments and
//! every `_with` entry point takes, and the process-wide defaults an option
//! left unset falls back to, all in this one place.

#[cfg(feature = "async")]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicU32, Ordering};
#[cfg(feature = "async")]
use std::time::Duration;

use crate::attempts::MaxAttempts;

/// The options of a delivery, single or batched, blocking or async: what
/// `#[idempotent(max_attempts = …)]` sets, and what
/// [`run_idempotent_with`](crate::run_idempotent_with) and the other
/// `_with` entry points take. An option left unset takes the process-wide
/// default (see [`default_max_attempts`]). A payload's fingerprint travels
/// with the message's key ([`ClaimKey::with_fingerprint`](crate::ClaimKey::with_fingerprint)),
/// and a stored result is chosen by the handler's return type
/// ([`StoredOutcome`](crate::StoredOutcome), the `_storing` entry points).
///
/// A [`MaxAttempts`] converts into the options that set it alone, so
/// `run_idempotent_with(conn, key, MaxAttempts::limit(3), body)` reads as
/// it says.
///
/// ```
/// use inbox_runtime::{MaxAttempts, Options};
///
/// let options = Options::new().max_attempts(MaxAttempts::limit(3));
/// assert_eq!(options.resolved_max_attempts(), MaxAttempts::limit(3));
/// assert_eq!(Options::from(MaxAttempts::Unbounded).resolved_max_attempts(), MaxAttempts::Unbounded);
/// assert_eq!(Options::new().resolved_max_attempts(), inbox_runtime::default_max_attempts());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[must_use]
pub struct Options {
    max_attempts: Option<MaxAttempts>,
}

impl Options {
    /// Every option unset: the process-wide defaults.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::Options::new(), inbox_runtime::Options::default());
    /// ```
    pub const fn new() -> Options {
        Options { max_attempts: None }
    }

    /// How many failed attempts a message gets before it is recorded as
    /// dead (see [`MaxAttempts`]).
    ///
    /// ```
    /// use inbox_runtime::{MaxAttempts, Options};
    /// let options = Options::new().max_attempts(MaxAttempts::Unbounded);
    /// assert_eq!(options.resolved_max_attempts(), MaxAttempts::Unbounded);
    /// ```
    pub const fn max_attempts(self, limit: MaxAttempts) -> Options {
        Options {
            max_attempts: Some(limit),
        }
    }

    /// The limit of failed attempts these options give: their own, or the
    /// process default ([`default_max_attempts`]) when unset.
    ///
    /// ```
    /// use inbox_runtime::{default_max_attempts, Options};
    /// assert_eq!(Options::new().resolved_max_attempts(), default_max_attempts());
    /// ```
    pub fn resolved_max_attempts(&self) -> MaxAttempts {
        self.max_attempts.unwrap_or_else(default_max_attempts)
    }
}

impl From<MaxAttempts> for Options {
    fn from(limit: MaxAttempts) -> Options {
        Options::new().max_attempts(limit)
    }
}

static DEFAULT_MAX_ATTEMPTS: AtomicU32 = AtomicU32::new(MaxAttempts::DEFAULT.encode());

/// Sets the limit of every handler that does not name its own
/// (`max_attempts = …` in the attribute, or [`Options::max_attempts`]),
/// for the whole process. Set it at start-up, before the first delivery.
///
/// ```
/// use inbox_runtime::{default_max_attempts, set_default_max_attempts, MaxAttempts};
///
/// set_default_max_attempts(MaxAttempts::limit(8));
/// assert_eq!(default_max_attempts(), MaxAttempts::limit(8));
/// set_default_max_attempts(MaxAttempts::DEFAULT);
/// ```
pub fn set_default_max_attempts(limit: MaxAttempts) {
    DEFAULT_MAX_ATTEMPTS.store(limit.encode(), Ordering::Relaxed);
}

/// The limit of handlers that do not name their own (see
/// [`set_default_max_attempts`]; [`MaxAttempts::DEFAULT`] until set).
///
/// ```
/// assert!(inbox_runtime::default_max_attempts().limit_value().is_some());
/// ```
pub fn default_max_attempts() -> MaxAttempts {
    MaxAttempts::decode(DEFAULT_MAX_ATTEMPTS.load(Ordering::Relaxed))
}

/// How long the server keeps the transaction of an async handler whose
/// future was dropped, unless changed with
/// [`set_abandoned_transaction_timeout`]: one minute.
///
/// ```
/// assert_eq!(inbox_runtime::DEFAULT_ABANDONED_TRANSACTION_TIMEOUT.as_secs(), 60);
/// ```
#[cfg(feature = "async")]
pub const DEFAULT_ABANDONED_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// The bound in milliseconds; `u64::MAX`: the default; 0: none.
#[cfg(feature = "async")]
static ABANDONED_TRANSACTION_TIMEOUT_MS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Bounds how long a dropped async handler future can keep its claim locked
/// (process-wide; [`DEFAULT_ABANDONED_TRANSACTION_TIMEOUT`] until set).
///
/// diesel-async cannot roll back from a destructor, so a handler whose future
/// is dropped leaves its transaction open on the connection, holding the row
/// lock on the claimed id: a redelivery of that id waits for it. A pool that
/// keeps the connection idle (deadpool recycles, and closes, a broken
/// connection only when it hands it out again) would make that wait last
/// indefinitely. So the outermost transaction of every async handler tells
/// the server to end it, and close the connection, once it has been idle for
/// longer than this bound: PostgreSQL through `SET LOCAL
/// idle_in_transaction_session_timeout` (sent with `BEGIN`, no extra round
/// trip), MySQL and MariaDB by lowering the session's `wait_timeout` for the
/// transaction and restoring it at `COMMIT`/`ROLLBACK` (whole seconds,
/// rounded up). A redelivery then waits at most about this long.
///
/// Pick it longer than the longest pause a handler body makes between two
/// statements (an HTTP call awaited inside the transaction counts): a body
/// idle for longer loses its connection, its work rolls back, and the
/// delivery fails with [`Recovery::Reconnect`](crate::Recovery::Reconnect).
/// `None` leaves the server's own settings alone. A handler nested in a
/// transaction of the caller's does not change it: that transaction is the
/// caller's.
///
/// ```
/// use std::time::Duration;
/// inbox_runtime::set_abandoned_transaction_timeout(Some(Duration::from_secs(30)));
/// assert_eq!(inbox_runtime::abandoned_transaction_timeout(), Some(Duration::from_secs(30)));
/// inbox_runtime::set_abandoned_transaction_timeout(None);
/// assert_eq!(inbox_runtime::abandoned_transaction_timeout(), None);
/// # inbox_runtime::set_abandoned_transaction_timeout(Some(inbox_runtime::DEFAULT_ABANDONED_TRANSACTION_TIMEOUT));
/// ```
#[cfg(feature = "async")]
pub fn set_abandoned_transaction_timeout(limit: Option<Duration>) {
    let millis = match limit {
        // At least a millisecond: zero would mean "no bound" to PostgreSQL.
        Some(limit) => u64::try_from(limit.as_millis())
            .unwrap_or(u64::MAX - 1)
            .clamp(1, u64::MAX - 1),
        None => 0,
    };
    ABANDONED_TRANSACTION_TIMEOUT_MS.store(millis, Ordering::Relaxed);
}

/// The bound set by [`set_abandoned_transaction_timeout`] (or the default).
///
/// ```
/// # use std::time::Duration;
/// assert!(inbox_runtime::abandoned_transaction_timeout().is_some_and(|limit| limit > Duration::ZERO));
/// ```
#[cfg(feature = "async")]
pub fn abandoned_transaction_timeout() -> Option<Duration> {
    match ABANDONED_TRANSACTION_TIMEOUT_MS.load(Ordering::Relaxed) {
        0 => None,
        u64::MAX => Some(DEFAULT_ABANDONED_TRANSACTION_TIMEOUT),
        millis => Some(Duration::from_millis(millis)),
    }
}
