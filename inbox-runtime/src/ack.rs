//! What a consumer tells its broker after a delivery: one decision, read
//! from the handler's result.

use std::error::Error as StdError;

use crate::error::Recovery;
use crate::error::{InboxError, Marker, Marks};
use crate::recovery::{error_chain, recovery};

/// What to tell the broker about a delivery, decided by [`ack_decision`].
///
/// | the handler returned | decision |
/// |---|---|
/// | `Ok` (processed, or a duplicate — also a redelivery of a dead message) | [`Ack`](AckDecision::Ack) |
/// | a database failure, a lost transaction, an ignored failed statement, a batch aborted ([`InboxError::BatchAborted`]) | [`Retry`](AckDecision::Retry) |
/// | its own error (a failed attempt, counted; see [`MaxAttempts`](crate::MaxAttempts)) | [`Retry`](AckDecision::Retry) |
/// | the handler's scope is declared by another handler too ([`InboxError::SharedScope`]): nothing ran | [`Retry`](AckDecision::Retry) |
/// | an invalid or missing message id | [`DeadLetter`](AckDecision::DeadLetter) |
/// | a rejection ([`InboxError::rejected`]) | [`DeadLetter`](AckDecision::DeadLetter) |
/// | attempts exhausted ([`InboxError::AttemptsExhausted`]) | [`DeadLetter`](AckDecision::DeadLetter) |
/// | the id was processed with a different payload ([`InboxError::Conflict`]), a payload that cannot be fingerprinted, a result that cannot be stored or replayed | [`DeadLetter`](AckDecision::DeadLetter) |
///
/// ```
/// use inbox_runtime::{ack_decision, AckDecision, InboxError};
///
/// let done: Result<(), InboxError> = Ok(());
/// assert_eq!(ack_decision(&done), AckDecision::Ack);
/// let rejected: Result<(), InboxError> = Err(InboxError::rejected("unknown sku"));
/// assert_eq!(ack_decision(&rejected), AckDecision::DeadLetter);
/// let db: Result<(), InboxError> = Err(InboxError::Database(diesel::result::Error::NotFound));
/// assert_eq!(ack_decision(&db), AckDecision::Retry);
/// // A message without an id (`id = msg.id` with `msg.id: Option<String>` = `None`).
/// let no_id = inbox_runtime::ClaimKey::new(inbox_runtime::HandlerName::new("h")?, &None::<String>);
/// assert_eq!(ack_decision(&no_id), AckDecision::DeadLetter);
/// # Ok::<(), InboxError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "the broker must be told what happened to the delivery"]
pub enum AckDecision {
    /// Acknowledge: the message's effects are committed (now or by an
    /// earlier delivery), or the message is dead and recorded as such.
    Ack,
    /// Redeliver (AMQP `nack` with requeue, JetStream `nak`, leave an SQS
    /// message to time out): nothing was committed. When the error's
    /// [`InboxError::recovery`] says [`Recovery::Reconnect`], the
    /// connection is broken: a pool discards it on return; a connection of
    /// your own must be replaced.
    Retry,
    /// Send to the dead-letter queue (AMQP `reject` without requeue to a
    /// dead-letter exchange, JetStream `term`): redelivering the message
    /// will never succeed.
    DeadLetter,
    /// Redeliver after a delay, not at once: another delivery of the same
    /// message is still in flight ([`InboxError::InProgress`]; nothing was
    /// committed or counted). JetStream: `Nak` with a delay
    /// (`AckKind::Nak(Some(delay))`); RabbitMQ, which requeues at once,
    /// has no delay of its own: reject to a delay queue whose message TTL
    /// dead-letters back to the work queue, or hold the message for the
    /// delay before the requeue. A delay of at least the delivery's claim
    /// bound ([`ClaimWait`](crate::ClaimWait)) lets the first delivery end.
    RetryLater,
}

/// The broker decision for a handler's result: see [`AckDecision`].
///
/// The error is searched along its `source()` chain for an [`InboxError`]
/// or a `diesel::result::Error`; an error that carries neither is the
/// handler's own, a failed attempt, and is retried (the inbox counts it and
/// gives up after the handler's [`MaxAttempts`](crate::MaxAttempts)).
///
/// ```
/// use inbox_runtime::{ack_decision, AckDecision, InboxError};
///
/// #[derive(Debug)]
/// enum AppError { Inbox(InboxError), ProviderDown }
/// impl From<InboxError> for AppError {
///     fn from(e: InboxError) -> Self { AppError::Inbox(e) }
/// }
/// impl std::fmt::Display for AppError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         match self {
///             AppError::Inbox(e) => e.fmt(f),
///             AppError::ProviderDown => f.write_str("payment provider is down"),
///         }
///     }
/// }
/// impl std::error::Error for AppError {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         match self {
///             AppError::Inbox(e) => Some(e),
///             AppError::ProviderDown => None,
///         }
///     }
/// }
///
/// let exhausted: Result<(), AppError> = Err(InboxError::AttemptsExhausted {
///     attempts: 5,
///     last_error: "payment provider is down".into(),
/// }
/// .into());
/// assert_eq!(ack_decision(&exhausted), AckDecision::DeadLetter);
/// let failed: Result<(), AppError> = Err(AppError::ProviderDown);
/// assert_eq!(ack_decision(&failed), AckDecision::Retry);
/// ```
pub fn ack_decision<R, E>(result: &Result<R, E>) -> AckDecision
where
    E: StdError + 'static,
{
    match result {
        Ok(_) => AckDecision::Ack,
        Err(error) => match classify(error) {
            Found::Final | Found::Rejected => AckDecision::DeadLetter,
            Found::InProgress | Found::Database(Recovery::RetryLater) => AckDecision::RetryLater,
            Found::Database(_) | Found::HandlerOwn | Found::Misconfigured => AckDecision::Retry,
        },
    }
}

/// [`ack_decision`] as a method of the handler's result.
///
/// ```
/// use inbox_runtime::{AckDecision, Acknowledge, InboxError};
/// let result: Result<(), InboxError> = Err(InboxError::rejected("bad"));
/// assert_eq!(result.ack_decision(), AckDecision::DeadLetter);
/// ```
pub trait Acknowledge {
    /// See [`ack_decision`].
    fn ack_decision(&self) -> AckDecision;
}

impl<R, E: StdError + 'static> Acknowledge for Result<R, E> {
    fn ack_decision(&self) -> AckDecision {
        ack_decision(self)
    }
}

/// What an error carries, as the runtime and [`ack_decision`] read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Never to be redelivered: an invalid id, exhausted attempts.
    Final,
    /// A business rejection.
    Rejected,
    /// A database failure (the body's, or the inbox's own).
    Database(Recovery),
    /// The program is misconfigured (a shared scope): retried, once the
    /// deploy is fixed, and never counted as a failed attempt.
    Misconfigured,
    /// Another delivery of the message is in flight: redelivered later,
    /// never counted.
    InProgress,
    /// Neither: the handler's own failure.
    HandlerOwn,
}

impl Found {
    /// Whether a body failure of this kind counts as a failed attempt: the
    /// handler's own failures do (and panics); database trouble that says
    /// nothing about the message does not.
    pub(crate) fn counts_as_attempt(self, error: &(dyn StdError + 'static)) -> bool {
        match self {
            Found::HandlerOwn => !says_database_trouble(error),
            Found::Database(Recovery::Reconnect | Recovery::RetryLater) => false,
            Found::Database(_) => !carries_lock_conflict(error),
            Found::Final | Found::Rejected | Found::Misconfigured | Found::InProgress => false,
        }
    }
}

/// Reads `error` and its `source()` chain.
pub(crate) fn classify(error: &(dyn StdError + 'static)) -> Found {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(inbox) = error.downcast_ref::<InboxError>() {
            return of_inbox_error(inbox);
        }
        if let Some(database) = error.downcast_ref::<diesel::result::Error>() {
            return match InboxError::find_in(database) {
                Some(inbox) => of_inbox_error(inbox),
                None => Found::Database(recovery(database)),
            };
        }
        if let Some(marker) = error.downcast_ref::<Marker>() {
            return match marker.marks {
                Marks::Final => Found::Final,
                Marks::Rejected => Found::Rejected,
                Marks::Misconfigured => Found::Misconfigured,
                Marks::InProgress => Found::InProgress,
            };
        }
        next = error.source();
    }
    Found::HandlerOwn
}

fn of_inbox_error(error: &InboxError) -> Found {
    match error {
        InboxError::InvalidMessageId { .. }
        | InboxError::AttemptsExhausted { .. }
        | InboxError::Conflict(_)
        | InboxError::InvalidFingerprint { .. }
        | InboxError::StoredResult { .. } => Found::Final,
        InboxError::Rejected { .. } => Found::Rejected,
        InboxError::SharedScope { .. } => Found::Misconfigured,
        InboxError::InProgress { .. } => Found::InProgress,
        other => Found::Database(other.recovery()),
    }
}

/// Whether an error in which no Diesel error was found reads as database
/// trouble all the same: a wrapper that forwards `Display` and `source()`
/// to a Diesel error (`#[error(transparent)] Db(#[from]
/// diesel::result::Error)`, the usual application error) hides the Diesel
/// error from the source chain, but shows its text, which is the server's
/// message. Read with the same tables as [`recovery`](crate::recovery()):
/// a lock conflict or a lost connection.
fn says_database_trouble(error: &(dyn StdError + 'static)) -> bool {
    recovery_in_text(error).is_some()
}

/// What the first error along `error`'s `source()` chain whose text is a
/// server's message for database trouble says to do (see
/// [`recovery_of_text`](crate::recovery::recovery_of_text)), if any does.
fn recovery_in_text(error: &(dyn StdError + 'static)) -> Option<Recovery> {
    error_chain(error).find_map(|error| crate::recovery::recovery_of_text(&error.to_string()))
}

/// What to do about a body's `error` that is database trouble: its
/// recovery, also through a wrapper that hides the Diesel error from the
/// `source()` chain but shows its text (`#[error(transparent)]`), whose
/// server message is read as [`recovery`] reads it. `Retry` when nothing
/// says more.
pub(crate) fn trouble_recovery(error: &(dyn StdError + 'static)) -> Recovery {
    match classify(error) {
        Found::Database(recovery) => recovery,
        _ => recovery_in_text(error).unwrap_or(Recovery::Retry),
    }
}

fn carries_lock_conflict(error: &(dyn StdError + 'static)) -> bool {
    error_chain(error)
        .find_map(|error| match error.downcast_ref::<InboxError>() {
            Some(InboxError::Database(database)) => Some(database),
            _ => error.downcast_ref::<diesel::result::Error>(),
        })
        .is_some_and(crate::is_lock_conflict)
}
