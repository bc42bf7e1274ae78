//! How a delivery runs: every option of a delivery in one value
//! ([`Options`]), which `#[idempotent(...)]` builds from its arguments and
//! every `_with` entry point takes, and the process-wide defaults an option
//! left unset falls back to, all in this one place.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::attempts::MaxAttempts;

/// The options of a delivery, single or batched, blocking or async: what
/// `#[idempotent(max_attempts = …, claim_wait = …)]` sets, and what
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
    claim_wait: Option<ClaimWait>,
}

impl Options {
    /// Every option unset: the process-wide defaults.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::Options::new(), inbox_runtime::Options::default());
    /// ```
    pub const fn new() -> Options {
        Options {
            max_attempts: None,
            claim_wait: None,
        }
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
            ..self
        }
    }

    /// How long the claim waits for another delivery of the same id that
    /// is still in flight (see [`ClaimWait`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use inbox_runtime::{ClaimWait, Options};
    /// let options = Options::new().claim_wait(ClaimWait::Bounded(Duration::from_millis(500)));
    /// assert_eq!(options.resolved_claim_wait(), ClaimWait::Bounded(Duration::from_millis(500)));
    /// ```
    pub const fn claim_wait(self, wait: ClaimWait) -> Options {
        Options {
            claim_wait: Some(wait),
            ..self
        }
    }

    /// The claim's bound these options give: their own, or the process
    /// default ([`default_claim_wait`]) when unset.
    ///
    /// ```
    /// use inbox_runtime::{default_claim_wait, Options};
    /// assert_eq!(Options::new().resolved_claim_wait(), default_claim_wait());
    /// ```
    pub fn resolved_claim_wait(&self) -> ClaimWait {
        self.claim_wait.unwrap_or_else(default_claim_wait)
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

/// How long a delivery's claim waits for another delivery of the same id
/// that is still in flight (claimed, not yet committed or rolled back: a
/// broker redelivered a message whose first delivery is slow).
///
/// When the bound passes, the delivery fails with
/// [`InboxError::InProgress`](crate::InboxError::InProgress): nothing ran,
/// nothing is counted, and the broker should redeliver the copy *later*
/// ([`Recovery::RetryLater`](crate::Recovery::RetryLater),
/// [`AckDecision::RetryLater`](crate::AckDecision::RetryLater)); once the
/// first delivery commits, a copy is a duplicate, and if it fails, a copy
/// processes the message. Without a bound a copy holds its worker for the
/// whole of the first delivery's body.
///
/// The bound applies to the claim only, and only in a transaction the
/// handler opens itself (not to a handler nested in its caller's
/// transaction, whose waits are the caller's): the body's own lock waits
/// keep the application's settings. Per backend:
///
/// - PostgreSQL: `lock_timeout` for the claim statement alone, set and
///   restored by the claim statement itself (no extra round trip); at
///   least 1 ms, at most `i32::MAX` ms (about 24.8 days, the longest it
///   takes).
/// - MariaDB: `SET STATEMENT innodb_lock_wait_timeout = N FOR` the claim;
///   InnoDB counts whole seconds, so a bound is rounded up to the next
///   second (500 ms waits 1 s), at most 1,073,741,824 s (the longest it
///   takes; `Duration::MAX` waits that long). MySQL has no `SET STATEMENT`: the first
///   bounded claim it refuses makes the process send unbounded claims,
///   which wait as the server's `innodb_lock_wait_timeout` says (50 s by
///   default; not tested here, the suite runs MariaDB).
/// - SQLite has one writer at a time: a second delivery waits for the
///   database's write lock, whichever message holds it, as long as the
///   connection's `busy_timeout` says; the bound is not applied. A claim
///   refused as busy (`database is locked`) is `InProgress` all the same.
///
/// [`ClaimWait::DEFAULT`] (2 s) unless [`set_default_claim_wait`] or
/// [`Options::claim_wait`] (`#[idempotent(claim_wait = "2s")]`) says
/// otherwise: long enough for a copy that arrives while the first delivery
/// commits to end as a duplicate, short enough that a redelivery storm of
/// a slow message does not hold every worker.
///
/// ```
/// use std::time::Duration;
/// use inbox_runtime::ClaimWait;
/// assert_eq!(ClaimWait::DEFAULT, ClaimWait::Bounded(Duration::from_secs(2)));
/// assert_ne!(ClaimWait::Unbounded, ClaimWait::DEFAULT);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimWait {
    /// The claim gives up after this long: `InProgress`.
    Bounded(Duration),
    /// The claim waits for the first delivery to end, however long it
    /// takes (the server's own lock timeout still applies).
    Unbounded,
}

impl ClaimWait {
    /// Two seconds.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::ClaimWait::DEFAULT.bound().map(|b| b.as_secs()), Some(2));
    /// ```
    pub const DEFAULT: ClaimWait = ClaimWait::Bounded(Duration::from_secs(2));

    /// The bound, `None` when unbounded.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::ClaimWait::Unbounded.bound(), None);
    /// ```
    pub const fn bound(self) -> Option<Duration> {
        match self {
            ClaimWait::Bounded(bound) => Some(bound),
            ClaimWait::Unbounded => None,
        }
    }
}

/// The claim wait in milliseconds; `u64::MAX`: the default; `u64::MAX - 1`:
/// unbounded.
static DEFAULT_CLAIM_WAIT_MS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Sets the claim's bound of every delivery that does not name its own
/// ([`Options::claim_wait`], `#[idempotent(claim_wait = …)]`), for the
/// whole process. Set it at start-up, before the first delivery.
///
/// ```
/// use inbox_runtime::{default_claim_wait, set_default_claim_wait, ClaimWait};
///
/// set_default_claim_wait(ClaimWait::Unbounded);
/// assert_eq!(default_claim_wait(), ClaimWait::Unbounded);
/// set_default_claim_wait(ClaimWait::DEFAULT);
/// ```
pub fn set_default_claim_wait(wait: ClaimWait) {
    let millis = match wait {
        ClaimWait::Bounded(bound) => u64::try_from(bound.as_millis())
            .unwrap_or(u64::MAX - 2)
            .min(u64::MAX - 2),
        ClaimWait::Unbounded => u64::MAX - 1,
    };
    DEFAULT_CLAIM_WAIT_MS.store(millis, Ordering::Relaxed);
}

/// The claim's bound of deliveries that do not name their own (see
/// [`set_default_claim_wait`]; [`ClaimWait::DEFAULT`] until set).
///
/// ```
/// assert!(inbox_runtime::default_claim_wait().bound().is_some());
/// ```
pub fn default_claim_wait() -> ClaimWait {
    match DEFAULT_CLAIM_WAIT_MS.load(Ordering::Relaxed) {
        u64::MAX => ClaimWait::DEFAULT,
        millis if millis == u64::MAX - 1 => ClaimWait::Unbounded,
        millis => ClaimWait::Bounded(Duration::from_millis(millis)),
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
