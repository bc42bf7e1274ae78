//! After a body fails: what is recorded about the failure, and the
//! statements that record it.
//!
//! A failed delivery's transaction has rolled back, its claim with it. The
//! runner then opens a short transaction of its own on the same connection
//! (only when the handler opened the outermost transaction) and:
//!
//! 1. counts the attempt in `inbox_failures` (insert, or add one);
//! 2. for a rejection, or an attempt that reached the handler's
//!    [`MaxAttempts`], marks the row dead and claims the id in
//!    `inbox_messages`, so later deliveries are duplicates. Should the claim
//!    find the id already claimed (a concurrent delivery processed it in the
//!    meantime), the message is not dead: the short transaction is rolled
//!    back and the delivery reports the body's error, to be redelivered as
//!    a duplicate.
//!
//! The delivery core (`delivery::steps::record_failure`) runs the
//! statements; this module decides what they are.

use std::any::Any;
use std::error::Error as StdError;
use std::fmt::Write as _;

use crate::ack::{Found, classify};
use crate::attempts::MaxAttempts;
use crate::backend::{Bind, InboxBackend, key_binds};
use crate::error::{InboxError, Marker, REJECTED, REJECTED_PREFIX, REJECTED_SUFFIX};
use crate::key::ClaimKey;
use crate::observe::Ending;
use crate::recovery::is_constraint_violation;
use crate::text::{MAX_ERROR_TEXT_BYTES, bounded, error_chain_text, error_text, panic_text};

/// A failed body, as it is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A failed attempt, with its error text.
    Attempt(String),
    /// A business rejection, with the error's text.
    Rejection(String),
}

impl Failure {
    /// What the body's `error` records: `None` for database trouble (a lock
    /// conflict, a lost connection), which says nothing about the message,
    /// and for the inbox's own final errors.
    pub(crate) fn of_error(error: &(dyn StdError + 'static)) -> Option<Failure> {
        let found = classify(error);
        if found == Found::Rejected {
            return Some(Failure::Rejection(rejection_reason(error)));
        }
        found
            .counts_as_attempt(error)
            .then(|| Failure::Attempt(error_chain_text(error)))
    }

    /// What a panic of the body records.
    pub(crate) fn of_panic(payload: &(dyn Any + Send)) -> Failure {
        let message = panic_text(payload);
        Failure::Attempt(bounded(format!("the handler panicked: {message}")))
    }

    /// The error text kept for the failure.
    pub(crate) fn text(&self) -> &str {
        match self {
            Failure::Attempt(text) | Failure::Rejection(text) => text,
        }
    }

    /// The failure with its text in ASCII, every other character written
    /// as `\u{…}`: what is recorded when the database's encoding cannot
    /// store the text (a PostgreSQL database in `LATIN1`, a euro sign).
    /// `None` when the text is ASCII already.
    pub(crate) fn in_ascii(&self) -> Option<Failure> {
        let text = self.text();
        if text.is_ascii() {
            return None;
        }
        let mut ascii = String::with_capacity(text.len() + 16);
        for c in text.chars() {
            if c.is_ascii() {
                ascii.push(c);
            } else {
                let _ = write!(ascii, "\\u{{{:x}}}", u32::from(c));
            }
        }
        if ascii.len() > MAX_ERROR_TEXT_BYTES {
            ascii.truncate(MAX_ERROR_TEXT_BYTES - 3);
            ascii.push_str("...");
        }
        Some(match self {
            Failure::Attempt(_) => Failure::Attempt(ascii),
            Failure::Rejection(_) => Failure::Rejection(ascii),
        })
    }
}

/// What to record instead after recording `failure` failed with `error`:
/// its text in ASCII ([`Failure::in_ascii`]) when the database refused the
/// text (the key's text cannot be the cause, the claim stored it already);
/// `None`: nothing else to try.
pub(crate) fn retry_in_ascii(error: &InboxError, failure: &Failure) -> Option<Failure> {
    match error {
        InboxError::Database(error) if crate::recovery::is_refused_key_text(error) => {
            failure.in_ascii()
        }
        _ => None,
    }
}

/// The reason of the rejection found in `error`.
///
/// A wrapper that forwards both `Display` and `source()` to the rejection
/// (`#[error(transparent)]`) hides the [`InboxError`] itself: its `source()`
/// is the rejection's marker. That wrapper's text is the rejection's, from
/// which the reason is read back.
fn rejection_reason(error: &(dyn StdError + 'static)) -> String {
    let mut next = Some(error);
    let mut previous: Option<&(dyn StdError + 'static)> = None;
    while let Some(error) = next {
        if let Some(InboxError::Rejected { reason }) = error.downcast_ref::<InboxError>() {
            return reason.clone();
        }
        let carried = error
            .downcast_ref::<diesel::result::Error>()
            .and_then(InboxError::find_in);
        if let Some(InboxError::Rejected { reason }) = carried {
            return reason.clone();
        }
        let marks_rejection = error
            .downcast_ref::<Marker>()
            .is_some_and(|marker| std::ptr::eq(marker, &REJECTED));
        if marks_rejection {
            let text = previous.map(ToString::to_string);
            let reason = text.as_deref().and_then(|text| {
                text.strip_prefix(REJECTED_PREFIX)?
                    .strip_suffix(REJECTED_SUFFIX)
            });
            if let Some(reason) = reason {
                return error_text(&reason);
            }
        }
        previous = Some(error);
        next = error.source();
    }
    error_text(error)
}

/// Why a delivery whose body succeeded did not commit.
pub(crate) enum NotCommitted {
    /// The `COMMIT` was refused by a constraint the database checks at
    /// commit (a deferred foreign key or unique key) and the body's writes
    /// violate: the message's own fault, the same on every delivery, so a
    /// failed attempt. Nothing committed; the connection is sound.
    Refused(diesel::result::Error),
    /// Anything else: the inbox's own step (storing the result) or database
    /// trouble. Not a failed attempt of the message.
    Failed(InboxError),
}

impl NotCommitted {
    /// What a failed commit of the handler's level says (blocking and
    /// async: the one place that decides which refusals count).
    pub(crate) fn of_commit(error: InboxError) -> NotCommitted {
        match error {
            InboxError::Database(refusal) if is_constraint_violation(&refusal) => {
                NotCommitted::Refused(refusal)
            }
            other => NotCommitted::Failed(other),
        }
    }
}

/// What recording a failure did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// The attempt was counted; the message may be delivered again.
    Counted,
    /// The attempt reached the limit: the message is dead now.
    Exhausted {
        /// The limit reached.
        attempts: u32,
        /// The attempt's error text.
        last_error: String,
    },
    /// The rejection was recorded: the message is dead now.
    Rejected,
    /// The id had been claimed by a delivery that committed in the
    /// meantime: nothing was recorded, and the message is done.
    ProcessedMeanwhile,
}

impl Recorded {
    /// Whether the failure makes the message dead, so the id must be claimed
    /// in the recording transaction.
    pub(crate) fn claims(&self) -> bool {
        matches!(self, Recorded::Exhausted { .. } | Recorded::Rejected)
    }

    /// How the delivery ended, as reported (`failure`: what was recorded).
    pub(crate) fn ending<'a>(&'a self, failure: &'a Failure) -> Ending<'a> {
        match self {
            Recorded::Counted | Recorded::ProcessedMeanwhile => Ending::Failed { attempts: None },
            Recorded::Exhausted {
                attempts,
                last_error,
            } => Ending::Dead {
                attempts: *attempts,
                last_error,
            },
            Recorded::Rejected => Ending::Rejected {
                reason: failure.text(),
            },
        }
    }

    /// The error the delivery ends with, in place of the body's: `None`
    /// keeps the body's error.
    pub(crate) fn into_error(self) -> Option<InboxError> {
        match self {
            Recorded::Exhausted {
                attempts,
                last_error,
            } => Some(InboxError::AttemptsExhausted {
                attempts,
                last_error,
            }),
            Recorded::Counted | Recorded::Rejected | Recorded::ProcessedMeanwhile => None,
        }
    }
}

/// How a delivery whose body failed ends, once its failure was recorded
/// (`recorded`: `Ok(None)` when there was nothing to record at its level):
/// `report` is told how it ended, and the result is the inbox error the
/// delivery fails with in place of the body's (`None`: the body's own
/// error).
///
/// A rejection that could not be recorded is retried (the database error is
/// returned), so that its redelivery records it; a count that could not be
/// written is lost (the count is a lower bound) and the body's error stands.
pub(crate) fn conclude(
    failure: Option<&Failure>,
    recorded: Result<Option<Recorded>, InboxError>,
    report: impl FnOnce(Ending<'_>),
) -> Option<InboxError> {
    let not_recorded = Ending::Failed { attempts: None };
    match (failure, recorded) {
        (None, _) | (Some(_), Ok(None)) => {
            report(not_recorded);
            None
        }
        (Some(failure), Ok(Some(recorded))) => {
            report(recorded.ending(failure));
            recorded.into_error()
        }
        (Some(Failure::Rejection(_)), Err(record_error)) => {
            report(not_recorded);
            Some(record_error)
        }
        (Some(Failure::Attempt(_)), Err(_)) => {
            report(not_recorded);
            None
        }
    }
}

/// The binds of the statement that counts one failed attempt of `key`
/// ([`FailureSql::record_attempt`](crate::backend::FailureSql)).
pub(crate) fn record_attempt_binds<'a>(key: &'a ClaimKey, failure: &'a Failure) -> [Bind<'a>; 3] {
    let [handler, message_id] = key_binds(key);
    [handler, message_id, Bind::Text(failure.text())]
}

/// The statement and binds that mark `key` dead: as rejected, or (one row
/// affected) when its attempts reached `limit`. `None` for an attempt under
/// an unbounded limit.
pub(crate) fn mark_dead<'k, DB: InboxBackend>(
    key: &'k ClaimKey,
    failure: &Failure,
    limit: MaxAttempts,
) -> Option<(&'static str, Vec<Bind<'k>>)> {
    let [handler, message_id] = key_binds(key);
    Some(match (failure, limit.limit_value()) {
        (Failure::Rejection(_), _) => (DB::FAILURE_SQL.mark_rejected, vec![handler, message_id]),
        (Failure::Attempt(_), Some(limit)) => (
            DB::FAILURE_SQL.mark_exhausted,
            vec![
                handler,
                message_id,
                Bind::Integer(i32::try_from(limit).unwrap_or(i32::MAX)),
            ],
        ),
        (Failure::Attempt(_), None) => return None,
    })
}

/// What marking a failure dead affected: `rows` from [`mark_dead`]'s
/// statement (`None`: there was none to run).
pub(crate) fn recorded(failure: &Failure, limit: MaxAttempts, rows: Option<usize>) -> Recorded {
    match (failure, rows) {
        (Failure::Rejection(_), _) => Recorded::Rejected,
        (Failure::Attempt(text), Some(1..)) => Recorded::Exhausted {
            attempts: limit.limit_value().unwrap_or(u32::MAX),
            last_error: text.clone(),
        },
        (Failure::Attempt(_), _) => Recorded::Counted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let text = bounded("é".repeat(MAX_ERROR_TEXT_BYTES));
        assert!(text.len() <= MAX_ERROR_TEXT_BYTES);
        assert!(text.ends_with('…'));
        assert_eq!(bounded("short".into()), "short");
        assert_eq!(bounded("a\0b".into()), "a\u{fffd}b");
        let nuls = bounded("\0".repeat(MAX_ERROR_TEXT_BYTES));
        assert!(nuls.len() <= MAX_ERROR_TEXT_BYTES, "{} bytes", nuls.len());
        assert!(nuls.ends_with('…') && !nuls.contains('\0'));
    }

    #[test]
    fn a_text_in_ascii_escapes_every_other_character_and_stays_bounded() {
        let failure = Failure::Rejection("a price in € is refused".into());
        assert_eq!(
            failure.in_ascii(),
            Some(Failure::Rejection("a price in \\u{20ac} is refused".into()))
        );
        assert_eq!(Failure::Attempt("plain".into()).in_ascii(), None);
        let long = Failure::Attempt(bounded("€".repeat(MAX_ERROR_TEXT_BYTES)));
        let ascii = long.in_ascii().expect("not ASCII");
        assert!(ascii.text().is_ascii() && ascii.text().len() <= MAX_ERROR_TEXT_BYTES);
        assert!(ascii.text().ends_with("..."));
    }

    #[test]
    fn a_panic_is_a_failed_attempt_with_its_message() {
        let payload: Box<dyn Any + Send> = Box::new("boom");
        assert_eq!(
            Failure::of_panic(&*payload),
            Failure::Attempt("the handler panicked: boom".into())
        );
        let payload: Box<dyn Any + Send> = Box::new(String::from("bang"));
        assert_eq!(
            Failure::of_panic(&*payload).text(),
            "the handler panicked: bang"
        );
    }

    #[test]
    fn database_trouble_is_not_an_attempt_but_other_errors_are() {
        let deadlock = diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::SerializationFailure,
            Box::new("could not serialize access".to_owned()),
        );
        assert_eq!(Failure::of_error(&deadlock), None);
        let gone = diesel::result::Error::BrokenTransactionManager;
        assert_eq!(Failure::of_error(&gone), None);
        let unique = diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::UniqueViolation,
            Box::new("duplicate key value violates unique constraint".to_owned()),
        );
        assert!(matches!(
            Failure::of_error(&unique),
            Some(Failure::Attempt(_))
        ));
        let rejected = InboxError::rejected("unknown sku");
        assert_eq!(
            Failure::of_error(&rejected),
            Some(Failure::Rejection("unknown sku".into()))
        );
        let carried = diesel::result::Error::from(InboxError::rejected("carried"));
        assert_eq!(
            Failure::of_error(&carried),
            Some(Failure::Rejection("carried".into()))
        );

        /// Forwards `Display` and `source` (`#[error(transparent)]`).
        #[derive(Debug)]
        struct Transparent(InboxError);
        impl fmt::Display for Transparent {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
        impl StdError for Transparent {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                self.0.source()
            }
        }
        /// `#[error(transparent)] Db(#[from] diesel::result::Error)`.
        #[derive(Debug)]
        struct TransparentDb(diesel::result::Error);
        impl fmt::Display for TransparentDb {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
        impl StdError for TransparentDb {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                self.0.source()
            }
        }
        let timeout = diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::Unknown,
            Box::new("Lock wait timeout exceeded; try restarting transaction".to_owned()),
        );
        assert_eq!(Failure::of_error(&TransparentDb(timeout)), None);
        assert_eq!(Failure::of_error(&TransparentDb(deadlock)), None);
        assert!(matches!(
            Failure::of_error(&TransparentDb(unique)),
            Some(Failure::Attempt(_))
        ));

        let wrapped = Transparent(InboxError::rejected("wrapped"));
        assert_eq!(
            Failure::of_error(&wrapped),
            Some(Failure::Rejection("wrapped".into()))
        );
    }
}
