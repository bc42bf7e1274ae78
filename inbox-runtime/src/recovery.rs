//! What a failed delivery should do next: retry, reconnect, or never retry.
//!
//! This is the one place that reads a database error's code (or, where the
//! driver exposes none, its message) and decides. Every retry loop of the
//! runtime (claims and pruning batches, blocking and async) asks
//! [`is_lock_conflict`]; consumers ask [`recovery`] or
//! [`InboxError::recovery`](crate::InboxError::recovery).
//!
//! # What the drivers expose
//!
//! Diesel maps a few server codes to a [`DatabaseErrorKind`]
//! (`SerializationFailure` for PostgreSQL 40001 and, on blocking MySQL
//! connections, InnoDB's 1213 from a prepared statement; `ReadOnlyTransaction`
//! for 25006 and 1792; `ClosedConnection`; `UnableToSendCommand`) and reports
//! everything else as [`DatabaseErrorKind::Unknown`] with the server's message
//! only: blocking PostgreSQL connections do not expose the SQLSTATE, blocking
//! MySQL connections do not expose the error number of plain statements (the
//! transaction statements too, when a server refuses to prepare them), and
//! diesel-async's MySQL driver maps neither 1213 nor any connection error. For those, and only those, the
//! message is matched against the server's text for the code named beside
//! it in each backend's table (`MESSAGES` in `backend/<backend>.rs`). PostgreSQL translates its messages when
//! `lc_messages` is not English: keep the server's `lc_messages` at `C` or an
//! English locale (the default) for the message fallback to apply; the
//! mapped kinds are recognised whatever the language.

use std::error::Error as StdError;

use diesel::result::{DatabaseErrorKind, Error};

use crate::backend::{SERVER_MESSAGES, ServerMessages};
use crate::error::{InboxError, Recovery};

impl Recovery {
    /// `true` unless the answer is [`Recovery::Never`].
    ///
    /// ```
    /// assert!(inbox_runtime::Recovery::Reconnect.is_retryable());
    /// assert!(!inbox_runtime::Recovery::Never.is_retryable());
    /// ```
    pub fn is_retryable(self) -> bool {
        self != Recovery::Never
    }
}

/// What to do after `error`, a Diesel error returned by a handler (or by any
/// Diesel call): see [`Recovery`]. An inbox error carried inside a Diesel
/// error (a handler whose error type is `diesel::result::Error`) is
/// classified as the inbox error.
///
/// ```
/// use inbox_runtime::{recovery, ClaimKey, HandlerName, Recovery};
///
/// let invalid = ClaimKey::new(HandlerName::new("billing")?, "").unwrap_err();
/// assert_eq!(recovery(&diesel::result::Error::from(invalid)), Recovery::Never);
/// assert_eq!(recovery(&diesel::result::Error::NotFound), Recovery::Retry);
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
pub fn recovery(error: &Error) -> Recovery {
    if let Some(inbox) = InboxError::find_in(error) {
        return inbox.recovery();
    }
    match error {
        Error::DatabaseError(kind, info) => database_recovery(kind, info.message()),
        Error::BrokenTransactionManager | Error::RollbackErrorOnCommit { .. } => {
            Recovery::Reconnect
        }
        _ => Recovery::Retry,
    }
}

/// `true` when `error` is a lock conflict that the database resolved by
/// rolling the statement or the transaction back: a serialization failure,
/// a deadlock, a lock wait timeout. Running the transaction again from the
/// start is the cure. This is the predicate of every retry loop in the
/// runtime.
///
/// ```
/// use diesel::result::{DatabaseErrorKind, Error};
/// let deadlock = Error::DatabaseError(
///     DatabaseErrorKind::Unknown,
///     Box::new("Deadlock found when trying to get lock; try restarting transaction".to_owned()),
/// );
/// assert!(inbox_runtime::is_lock_conflict(&deadlock));
/// assert!(!inbox_runtime::is_lock_conflict(&Error::NotFound));
/// ```
pub fn is_lock_conflict(error: &Error) -> bool {
    match error {
        Error::DatabaseError(_, info) if matches_any(info.message(), CONNECTION_LOST_MESSAGES) => {
            false
        }
        Error::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => true,
        Error::DatabaseError(DatabaseErrorKind::Unknown, info) => {
            matches_any(info.message(), LOCK_CONFLICT_MESSAGES)
        }
        _ => false,
    }
}

/// `true` when `error` says a statement gave up waiting for a lock another
/// transaction holds: PostgreSQL's `lock_timeout` (55P03), InnoDB's
/// `innodb_lock_wait_timeout` (1205), SQLite's busy database. On a bounded
/// claim, a delivery of the same id still in flight
/// ([`InboxError::InProgress`]).
pub(crate) fn is_lock_wait_timeout(error: &Error) -> bool {
    matches!(error, Error::DatabaseError(_, info) if matches_any(info.message(), LOCK_WAIT_TIMEOUT_MESSAGES))
}

/// `true` when `error` is an integrity constraint the message's own effect
/// violates (a foreign key, a unique key, a check, a not-null or exclusion
/// constraint, a restriction): the same writes fail the same way on every
/// delivery. The runtime asks it of a refused `COMMIT`, where a deferred
/// constraint is checked: such a refusal is a failed attempt of the
/// message, counted like a failed body.
pub(crate) fn is_constraint_violation(error: &Error) -> bool {
    matches!(
        error,
        Error::DatabaseError(
            DatabaseErrorKind::ForeignKeyViolation
                | DatabaseErrorKind::UniqueViolation
                | DatabaseErrorKind::CheckViolation
                | DatabaseErrorKind::NotNullViolation
                | DatabaseErrorKind::RestrictViolation
                | DatabaseErrorKind::ExclusionViolation,
            _
        )
    )
}

/// `true` when the database refused the text of a claim's key itself: the
/// inbox's own length checks, or a character the server's encoding cannot
/// represent. Such a message fails the same way on every delivery.
pub(crate) fn is_refused_key_text(error: &Error) -> bool {
    matches!(
        error,
        Error::DatabaseError(DatabaseErrorKind::CheckViolation, _)
    ) || is_unknown_in(error, REFUSED_TEXT_MESSAGES)
}

/// `true` when `error` is a statement refused because the transaction was
/// already aborted by an earlier failed statement (PostgreSQL's 25P02): the
/// failure is that earlier statement's, one a body ignored when the inbox's
/// own statement is the one refused.
pub(crate) fn is_transaction_aborted(error: &Error) -> bool {
    is_unknown_in(error, TRANSACTION_ABORTED_MESSAGES)
}

/// `true` when `error` is a commit that failed without saying why, and
/// may have committed (see `ServerMessages::commit_unanswered`).
pub(crate) fn is_commit_unanswered(error: &Error) -> bool {
    is_unknown_in(error, COMMIT_UNANSWERED_MESSAGES)
}

/// `true` when `error` is a database error Diesel reports as `Unknown`
/// whose message contains a text of `table`.
fn is_unknown_in(error: &Error, table: Table) -> bool {
    matches!(
        error,
        Error::DatabaseError(DatabaseErrorKind::Unknown, info) if matches_any(info.message(), table)
    )
}

fn database_recovery(kind: &DatabaseErrorKind, message: &str) -> Recovery {
    // The message first: PostgreSQL ends a session with a FATAL error whose
    // code may be mapped to another kind (a standby's "terminating connection
    // due to conflict with recovery" is 40001, a serialization failure), yet
    // the connection is gone.
    if matches_any(message, CONNECTION_LOST_MESSAGES)
        || matches_any(message, STATEMENTS_LOST_MESSAGES)
    {
        return Recovery::Reconnect;
    }
    match kind {
        DatabaseErrorKind::ClosedConnection
        | DatabaseErrorKind::UnableToSendCommand
        | DatabaseErrorKind::ReadOnlyTransaction => Recovery::Reconnect,
        _ => Recovery::Retry,
    }
}

/// What a message text of the backends' tables says to do: `Reconnect`
/// for a lost connection, `Retry` for a lock conflict, `None` for any other
/// text. For errors that show a server's message without carrying the
/// Diesel error (an application error that forwards `Display`).
pub(crate) fn recovery_of_text(text: &str) -> Option<Recovery> {
    if matches_any(text, CONNECTION_LOST_MESSAGES) || matches_any(text, STATEMENTS_LOST_MESSAGES) {
        Some(Recovery::Reconnect)
    } else if matches_any(text, LOCK_CONFLICT_MESSAGES) {
        Some(Recovery::Retry)
    } else {
        None
    }
}

/// `true` when `error`, or an error along its `source()` chain, says the
/// connection's prepared statements are not the server's (the backends'
/// `statements_lost` tables, read in each error's text, so that a wrapper
/// that hides the Diesel error but shows its message counts too): every
/// statement the connection cached fails the same way on it, so the
/// runtime marks it broken (see
/// [`leave_broken_if_unusable`](crate::execution::leave_broken_if_unusable)).
pub(crate) fn statements_lost(error: &(dyn StdError + 'static)) -> bool {
    error_chain(error).any(|error| matches_any(&error.to_string(), STATEMENTS_LOST_MESSAGES))
}

/// `error`, then each error along its `source()` chain.
pub(crate) fn error_chain<'e>(
    error: &'e (dyn StdError + 'static),
) -> impl Iterator<Item = &'e (dyn StdError + 'static)> {
    std::iter::successors(Some(error), |&error| error.source())
}

/// Which table of the backends' [`ServerMessages`] a message is looked up
/// in.
type Table = fn(&ServerMessages) -> &'static [(&'static str, &'static str)];

/// `true` when `message` contains a text of `table` of any backend (a
/// Diesel error does not say which backend sent it).
fn matches_any(message: &str, table: Table) -> bool {
    SERVER_MESSAGES
        .iter()
        .flat_map(|backend| table(backend))
        .any(|(_, text)| message.contains(text))
}

const LOCK_CONFLICT_MESSAGES: Table = |messages| messages.lock_conflict;
const LOCK_WAIT_TIMEOUT_MESSAGES: Table = |messages| messages.lock_wait_timeout;
const CONNECTION_LOST_MESSAGES: Table = |messages| messages.connection_lost;
const REFUSED_TEXT_MESSAGES: Table = |messages| messages.refused_text;
const TRANSACTION_ABORTED_MESSAGES: Table = |messages| messages.transaction_aborted;
const STATEMENTS_LOST_MESSAGES: Table = |messages| messages.statements_lost;
const COMMIT_UNANSWERED_MESSAGES: Table = |messages| messages.commit_unanswered;

/// The inbox error's answer, here beside the rules it applies (the error
/// type itself knows nothing of them).
impl InboxError {
    /// What to do next: retry on the same connection, reconnect then retry,
    /// or never retry (see [`Recovery`](crate::Recovery)).
    ///
    /// ```
    /// use inbox_runtime::{ClaimKey, HandlerName, InboxError, Recovery};
    /// let invalid = ClaimKey::new(HandlerName::new("h")?, "").unwrap_err();
    /// assert_eq!(invalid.recovery(), Recovery::Never);
    /// let lost = InboxError::Database(diesel::result::Error::BrokenTransactionManager);
    /// assert_eq!(lost.recovery(), Recovery::Reconnect);
    /// # Ok::<(), InboxError>(())
    /// ```
    pub fn recovery(&self) -> Recovery {
        match self {
            InboxError::InvalidMessageId { .. }
            | InboxError::InvalidHandlerName { .. }
            | InboxError::InvalidRetention { .. }
            | InboxError::InvalidBatchSize { .. }
            | InboxError::OutsideTransaction { .. }
            | InboxError::InsideTransaction { .. }
            | InboxError::InvalidOutgoingMessage { .. }
            | InboxError::Rejected { .. }
            | InboxError::AttemptsExhausted { .. }
            | InboxError::Conflict(_)
            | InboxError::InvalidFingerprint { .. }
            | InboxError::StoredResult { .. } => Recovery::Never,
            InboxError::Database(error) => recovery(error),
            InboxError::IgnoredStatementFailure { .. }
            | InboxError::Migration(_)
            | InboxError::SharedScope { .. } => Recovery::Retry,
            InboxError::TransactionLost { .. } => Recovery::Reconnect,
            InboxError::InProgress { .. } => Recovery::RetryLater,
            InboxError::BatchAborted { recovery, .. } => *recovery,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown(message: &str) -> Error {
        Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_owned()))
    }

    fn kind(kind: DatabaseErrorKind) -> Error {
        Error::DatabaseError(kind, Box::new("as mapped by the driver".to_owned()))
    }

    /// Messages exactly as the servers of this suite send them.
    const LOCK_CONFLICTS: &[&str] = &[
        "deadlock detected",
        "could not serialize access due to concurrent update",
        "could not obtain lock on row in relation \"inbox_messages\"",
        "canceling statement due to lock timeout",
        "Deadlock found when trying to get lock; try restarting transaction",
        "Lock wait timeout exceeded; try restarting transaction",
        "Record has changed since last read in table 'inbox_messages'",
    ];

    const CONNECTION_LOST: &[&str] = &[
        "terminating connection due to administrator command",
        "terminating connection due to immediate shutdown command",
        "terminating connection because of crash of another server process",
        "terminating connection due to idle-session timeout",
        "terminating connection due to unexpected postmaster exit",
        "the database system is starting up",
        "the database system is shutting down",
        "the database system is in recovery mode",
        "the database system is not yet accepting connections",
        "terminating connection due to idle-in-transaction timeout",
        "cannot execute INSERT in a read-only transaction",
        "server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally",
        "no connection to the server",
        "SSL connection has been closed unexpectedly\n",
        "MySQL server has gone away",
        "Server has gone away",
        "Lost connection to server during query",
        "Lost connection to MySQL server during query",
        "Server shutdown in progress",
        "Connection was killed",
        "WSREP has not yet prepared node for application use",
        "The MariaDB server is running with the --read-only option so it cannot execute this statement",
        "The MySQL server is running with the --super-read-only option so it cannot execute this statement",
        "Connection to the server is closed.",
        "Input/output error: Broken pipe (os error 32)",
        "Input/output error: Connection reset by peer (os error 104)",
    ];

    #[test]
    fn lock_conflicts_are_retried_on_the_same_connection() {
        for message in LOCK_CONFLICTS {
            let error = unknown(message);
            assert!(is_lock_conflict(&error), "{message}");
            assert_eq!(recovery(&error), Recovery::Retry, "{message}");
        }
        let mapped = kind(DatabaseErrorKind::SerializationFailure);
        assert!(is_lock_conflict(&mapped));
        assert_eq!(recovery(&mapped), Recovery::Retry);
    }

    #[test]
    fn lost_connections_need_a_new_connection() {
        for message in CONNECTION_LOST {
            let error = unknown(message);
            assert_eq!(recovery(&error), Recovery::Reconnect, "{message}");
            assert!(!is_lock_conflict(&error), "{message}");
        }
        for mapped in [
            DatabaseErrorKind::ClosedConnection,
            DatabaseErrorKind::UnableToSendCommand,
            DatabaseErrorKind::ReadOnlyTransaction,
        ] {
            assert_eq!(recovery(&kind(mapped)), Recovery::Reconnect);
        }
        assert_eq!(
            recovery(&Error::BrokenTransactionManager),
            Recovery::Reconnect
        );
        let standby_conflict = Error::DatabaseError(
            DatabaseErrorKind::SerializationFailure,
            Box::new("terminating connection due to conflict with recovery".to_owned()),
        );
        assert_eq!(recovery(&standby_conflict), Recovery::Reconnect);
        assert!(!is_lock_conflict(&standby_conflict));
        assert_eq!(
            recovery(&Error::RollbackErrorOnCommit {
                rollback_error: Box::new(Error::BrokenTransactionManager),
                commit_error: Box::new(Error::NotFound),
            }),
            Recovery::Reconnect
        );
    }

    #[test]
    fn other_failures_are_retried_and_not_lock_conflicts() {
        for error in [
            unknown("relation \"effects\" does not exist"),
            kind(DatabaseErrorKind::UniqueViolation),
            Error::NotFound,
        ] {
            assert_eq!(recovery(&error), Recovery::Retry, "{error}");
            assert!(!is_lock_conflict(&error), "{error}");
        }
    }

    #[test]
    fn text_the_server_cannot_store_is_recognised() {
        assert!(is_refused_key_text(&unknown(
            "character with byte sequence 0xe2 0x82 0xac in encoding \"UTF8\" has no equivalent in encoding \"LATIN1\""
        )));
        assert!(is_refused_key_text(&kind(
            DatabaseErrorKind::CheckViolation
        )));
        assert!(!is_refused_key_text(&unknown("deadlock detected")));
    }

    #[test]
    fn an_aborted_transaction_is_recognised() {
        assert!(is_transaction_aborted(&unknown(
            "current transaction is aborted, commands ignored until end of transaction block"
        )));
        assert!(!is_transaction_aborted(&unknown("deadlock detected")));
        assert!(!is_transaction_aborted(&kind(
            DatabaseErrorKind::SerializationFailure
        )));
    }

    #[test]
    fn statements_the_server_does_not_have_need_a_new_connection() {
        for message in [
            "prepared statement \"__diesel_stmt_2\" does not exist",
            "prepared statement \"__diesel_stmt_1\" already exists",
            "prepared statement \"s4\" does not exist",
            "bind message supplies 2 parameters, but prepared statement \"s1\" requires 3",
            "Unknown prepared statement handler (7) given to mysqld_stmt_execute",
        ] {
            let error = unknown(message);
            assert_eq!(recovery(&error), Recovery::Reconnect, "{message}");
            assert!(statements_lost(&error), "{message}");
            assert!(!is_lock_conflict(&error), "{message}");
        }
        assert!(!statements_lost(&unknown(
            "relation \"effects\" does not exist"
        )));
        assert!(!statements_lost(&Error::NotFound));
    }
}
