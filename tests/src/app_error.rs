//! The application error type the suites' handlers return: the
//! kind of error type `#[idempotent]` is meant for, with a variant for
//! Diesel's errors, one for the inbox's, and one of the application's own.

use inbox_runtime::{InboxError, Recovery};

/// An application error type of the kind the attribute is meant for: the
/// inbox's error wrapped transparently, which `ack_decision` sees through.
///
/// ```
/// use inbox_runtime::Recovery;
/// use inbox_tests::AppError;
///
/// let error = AppError::from(diesel::result::Error::NotFound);
/// assert_eq!(error.recovery(), inbox_runtime::recovery(&diesel::result::Error::NotFound));
/// assert_eq!(AppError::Failed("no such account").recovery(), Recovery::Retry);
/// ```
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A Diesel error of the handler's body.
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
    /// An error of the inbox (an invalid id, a lost transaction, …).
    #[error(transparent)]
    Inbox(#[from] InboxError),
    /// The application's own failure on a message (a failed attempt).
    #[error("the handler failed: {0}")]
    Failed(&'static str),
}

impl AppError {
    /// What a consumer does next (the guide's "When the database goes
    /// away"): the inbox's answer for database and inbox errors; the
    /// application's own failure is "not done, try again".
    pub fn recovery(&self) -> Recovery {
        match self {
            AppError::Db(error) => inbox_runtime::recovery(error),
            AppError::Inbox(error) => error.recovery(),
            AppError::Failed(_) => Recovery::Retry,
        }
    }

    /// The inbox error inside, if that is what this is.
    pub fn inbox(&self) -> Option<&InboxError> {
        match self {
            AppError::Inbox(error) => Some(error),
            _ => None,
        }
    }
}
