//! Whether a handler's error type carries the inbox's errors to
//! [`ack_decision`](crate::ack_decision).
//!
//! A delivery's answer (dead-letter, retry, retry later) is read from the
//! error the handler returns, through its `source()` chain. An error type
//! written by hand that converts an [`InboxError`] into itself but does not
//! return it from `source()` compiles, and then every answer reads as the
//! handler's own failure: a message without an id is retried forever, a copy
//! in flight is redelivered at once. The attribute registers, for each
//! handler whose return type it can name outside the function, a probe that
//! converts an inbox error and a database error into the handler's error
//! type and reads them back; [`check`](super::check) reports the types that
//! hide them.

use std::fmt;
use std::time::Duration;

use crate::ack::{Found, classify, trouble_recovery};
use crate::error::{HandlerError, InboxError, KeyProblem, Recovery, into_handler_error};

/// What a probe found about one handler's error type.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{idempotent, registry};
///
/// #[idempotent(id = msg, handler = "docs.error_type.ship")]
/// fn ship(conn: &mut SqliteConnection, msg: &str) -> QueryResult<()> {
///     Ok(())
/// }
///
/// let ship = registry::find("docs.error_type.ship").next().expect("registered");
/// let error_type = ship.error_type().expect("a free function's return type is probed");
/// assert!(error_type.name().starts_with("diesel::result::"), "{}", error_type.name());
/// assert!(error_type.carries_inbox_errors() && error_type.carries_database_errors());
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorType {
    name: &'static str,
    inbox_errors: bool,
    database_errors: bool,
}

impl ErrorType {
    /// The type's name, as [`std::any::type_name`] gives it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether an [`InboxError`] converted into this type (`From`) is found
    /// again through its `source()` chain, so [`ack_decision`] tells an
    /// invalid id (dead-letter) and a copy in flight (retry later) from
    /// the handler's own failures.
    ///
    /// [`ack_decision`]: crate::ack_decision
    pub fn carries_inbox_errors(&self) -> bool {
        self.inbox_errors
    }

    /// Whether a `diesel::result::Error` converted into this type is found
    /// again (through the `source()` chain, or through a text that forwards
    /// the server's message, as `#[error(transparent)]` does), so a closed
    /// connection reads as
    /// [`Recovery::Reconnect`](crate::Recovery::Reconnect) and database
    /// trouble is not counted as a failed attempt of the message.
    pub fn carries_database_errors(&self) -> bool {
        self.database_errors
    }

    /// Whether it carries both: nothing for [`check`](super::check) to
    /// report.
    pub fn is_transparent(&self) -> bool {
        self.inbox_errors && self.database_errors
    }
}

impl fmt::Display for ErrorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = match (self.inbox_errors, self.database_errors) {
            (true, true) => return write!(f, "`{}` carries the inbox's errors", self.name),
            (false, true) => "the inbox's errors (`InboxError`)",
            (true, false) => "database errors (`diesel::result::Error`)",
            (false, false) => "the inbox's errors and database errors",
        };
        write!(
            f,
            "`{}` hides {hidden} from `ack_decision`: return the converted error \
             from `source()` (thiserror: `#[from]` or `#[error(transparent)]`)",
            self.name
        )
    }
}

/// What the attribute registers for a handler's error type: a function
/// that probes it, or nothing when the return type names something the
/// registration cannot (a generic parameter, `Self`, a lifetime). Not an
/// API: see [`RegisteredHandler::error_type`](super::RegisteredHandler::error_type).
#[doc(hidden)]
#[derive(Clone, Copy)]
pub struct ErrorTypeProbe(Option<fn() -> Option<ErrorType>>);

impl ErrorTypeProbe {
    /// A probe (`probe` runs [`ProbeHandlerError::probe_error_type`]).
    pub const fn new(probe: fn() -> Option<ErrorType>) -> Self {
        ErrorTypeProbe(Some(probe))
    }

    /// No probe.
    pub const NONE: ErrorTypeProbe = ErrorTypeProbe(None);

    pub(super) fn run(&self) -> Option<ErrorType> {
        self.0.and_then(|probe| probe())
    }
}

// A registration is compared and hashed by what it declares; the probe is
// derived from the return type the declaration names.
impl PartialEq for ErrorTypeProbe {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ErrorTypeProbe {}

impl std::hash::Hash for ErrorTypeProbe {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

impl fmt::Debug for ErrorTypeProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "ErrorTypeProbe"
        } else {
            "ErrorTypeProbe(none)"
        })
    }
}

/// Converts a sample of each kind of error the runtime hands a handler into
/// `E`, the way a delivery does, and reads it back as `ack_decision` does.
pub(crate) fn probe<E: HandlerError>() -> ErrorType {
    let in_flight: E = into_handler_error(InboxError::InProgress {
        handler: "probe".to_owned(),
        message_id: "probe".to_owned(),
        waited: Duration::ZERO,
    });
    let missing_id: E = into_handler_error(InboxError::InvalidMessageId {
        handler: "probe".to_owned(),
        message_id: String::new(),
        problem: KeyProblem::Missing,
    });
    // As a server reports a lost connection: found through the chain, or
    // through the text of a wrapper that forwards `Display` and `source()`
    // to the Diesel error (`#[error(transparent)]`), as deliveries read it.
    let closed: E = into_handler_error(InboxError::Database(diesel::result::Error::DatabaseError(
        diesel::result::DatabaseErrorKind::ClosedConnection,
        Box::new("terminating connection due to administrator command".to_owned()),
    )));
    ErrorType {
        name: std::any::type_name::<E>(),
        inbox_errors: classify(&in_flight) == Found::InProgress
            && classify(&missing_id) == Found::Final,
        database_errors: trouble_recovery(&closed) == Recovery::Reconnect,
    }
}

/// The probe of a handler's return type, chosen by method resolution in the
/// registration the attribute emits (`(&ErrorTypeOf::<RET>::new()).probe_error_type()`):
/// this impl for a `Result` whose error type is a [`HandlerError`], the
/// [`ProbeNothing`] impl on `&ErrorTypeOf<T>` for any other type, so a wrong
/// return type is reported once, where the delivery names it, and not here.
#[doc(hidden)]
pub trait ProbeHandlerError {
    fn probe_error_type(&self) -> Option<ErrorType>;
}

/// The fallback of [`ProbeHandlerError`]: no probe.
#[doc(hidden)]
pub trait ProbeNothing {
    fn probe_error_type(&self) -> Option<ErrorType> {
        None
    }
}

/// A handler's return type, named for the probe.
#[doc(hidden)]
pub struct ErrorTypeOf<T: ?Sized>(std::marker::PhantomData<fn() -> Box<T>>);

impl<T: ?Sized> ErrorTypeOf<T> {
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        ErrorTypeOf(std::marker::PhantomData)
    }
}

impl<R, E: HandlerError> ProbeHandlerError for ErrorTypeOf<Result<R, E>> {
    fn probe_error_type(&self) -> Option<ErrorType> {
        Some(probe::<E>())
    }
}

impl<T: ?Sized> ProbeNothing for &ErrorTypeOf<T> {}
