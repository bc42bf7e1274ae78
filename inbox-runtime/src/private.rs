//! Glue for the code `#[idempotent]` generates. Not a public API: use the
//! documented functions this module forwards to.

use diesel::connection::Connection;

use crate::backend::InboxBackend;
use crate::error::{HandlerError, InboxError};
use crate::key::{ClaimKey, HandlerName};
use crate::message_id::MessageId;
use crate::outcome::OnDuplicate;

/// Builds the claim key from the handler's name and its id expression.
pub fn claim_key<M: MessageId + ?Sized>(
    handler: &'static str,
    id: &M,
) -> Result<ClaimKey, InboxError> {
    ClaimKey::new(HandlerName::new(handler)?, id)
}

/// Runs the handler body through [`crate::run_idempotent`], or returns the
/// key's validation error without touching the database.
pub fn run_sync<C, R, E, F>(
    conn: &mut C,
    key: Result<ClaimKey, InboxError>,
    body: F,
) -> Result<R, E>
where
    C: Connection,
    C::Backend: InboxBackend,
    R: OnDuplicate,
    E: HandlerError,
    F: FnOnce(&mut C) -> Result<R, E>,
{
    match key {
        Ok(key) => crate::run_idempotent(conn, key, body),
        Err(error) => Err(E::from(error)),
    }
}

/// The shape of a handler's return type, checked where the user wrote it.
#[diagnostic::on_unimplemented(
    message = "an idempotent handler must return `Result<R, E>`, not `{Self}`",
    label = "the body runs in a transaction that commits on `Ok` and rolls back on `Err`",
    note = "return `Result<(), E>` or `Result<inbox_runtime::Outcome<T>, E>`, where `E` implements `From<diesel::result::Error>` and `From<inbox_runtime::InboxError>`"
)]
pub trait HandlerResult {
    /// The `Ok` type.
    type Ok;
    /// The `Err` type.
    type Err;
}

impl<R, E> HandlerResult for Result<R, E> {
    type Ok = R;
    type Err = E;
}

/// Compile-time check of a handler's return type; does nothing at run time.
pub fn check_output<T>()
where
    T: HandlerResult,
    T::Ok: OnDuplicate,
    T::Err: HandlerError,
{
}
