//! The application error type the suites' handlers return: the
//! kind of error type `#[idempotent]` is meant for, with a variant for
//! Diesel's errors, one for the inbox's, and one of the application's own.

use inbox_runtime::{InboxError, Recovery};

/// An application error type of the kind the attribute is meant for.
///
/// ```
/// use inbox_runtime::Recovery;
/// use inbox_tests::AppError;
///
/// let error = AppError::from(diesel::result::Error::NotFound);
/// assert_eq!(error.recovery(), inbox_runtime::recovery(&diesel::result::Error::NotFound));
/// assert_eq!(AppError::Rejected("no such account").recovery(), Recovery::Retry);
/// ```
#[derive(Debug)]
pub enum AppError {
    /// A Diesel error of the handler's body.
    Db(diesel::result::Error),
    /// An error of the inbox (an invalid id, a lost transaction, …).
    Inbox(InboxError),
    /// The application's own rejection of a message.
    Rejected(&'static str),
}

impl From<diesel::result::Error> for AppError {
    fn from(error: diesel::result::Error) -> Self {
        AppError::Db(error)
    }
}

impl From<InboxError> for AppError {
    fn from(error: InboxError) -> Self {
        AppError::Inbox(error)
    }
}

impl AppError {
    /// What a consumer does next (the README's "When the database goes
    /// away"): the inbox's answer for database and inbox errors; the
    /// application's own rejection is "not done, try again".
    pub fn recovery(&self) -> Recovery {
        match self {
            AppError::Db(error) => inbox_runtime::recovery(error),
            AppError::Inbox(error) => error.recovery(),
            AppError::Rejected(_) => Recovery::Retry,
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
