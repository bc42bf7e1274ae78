//! The application error type the end-to-end suites' handlers return: the
//! kind of error type `#[idempotent]` is meant for, with a variant for
//! Diesel's errors, one for the inbox's, and one of the application's own.

use inbox_runtime::{InboxError, Recovery};

/// An application error type of the kind the attribute is meant for.
#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Inbox(InboxError),
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
    #[allow(dead_code)] // not every suite asks
    pub fn recovery(&self) -> Recovery {
        match self {
            AppError::Db(error) => inbox_runtime::recovery(error),
            AppError::Inbox(error) => error.recovery(),
            AppError::Rejected(_) => Recovery::Retry,
        }
    }

    /// The inbox error inside, if that is what this is.
    #[allow(dead_code)] // not every suite asks
    pub fn inbox(&self) -> Option<&InboxError> {
        match self {
            AppError::Inbox(error) => Some(error),
            _ => None,
        }
    }
}
