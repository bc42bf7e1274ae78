//! Running a handler body exactly once per message id.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

use diesel::connection::Connection;

use crate::backend::InboxBackend;
use crate::claim::{claim, Claim};
use crate::error::HandlerError;
use crate::key::ClaimKey;
use crate::outcome::OnDuplicate;

/// Runs `body` inside one transaction that first claims `key`, unless the key
/// was already claimed. This is what `#[idempotent]` expands to.
///
/// - A first delivery: the id is claimed, `body` runs on the transaction's
///   connection, and the claim commits together with the body's effects.
/// - A duplicate: `body` does not run and nothing is written; the result is
///   `Ok(R::on_duplicate())` (`()` or [`Outcome::Duplicate`](crate::Outcome)).
/// - `body` returns `Err` or panics: everything rolls back, the claim
///   included, so a redelivery processes the message again. A panic is
///   resumed after the rollback.
/// - Called inside a transaction already open on `conn`, the work becomes a
///   savepoint: the claim is final only when the outer transaction commits,
///   and vanishes with it if it rolls back.
///
/// Only effects written through the connection handed to `body` are covered.
/// Calls to other systems (HTTP, e-mail, another database) are not rolled
/// back and may run again after a failure: give them an idempotency key of
/// their own (the message id is a good one).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{run_idempotent, ClaimKey, HandlerName, Outcome};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let handler = HandlerName::new("greeter")?;
///
/// let mut deliver = |conn: &mut SqliteConnection, id: &str| {
///     let key = ClaimKey::new(handler.clone(), id)?;
///     run_idempotent(conn, key, |_conn| Ok::<_, inbox_runtime::InboxError>(Outcome::Processed(id.len())))
/// };
/// assert_eq!(deliver(&mut conn, "m-1")?, Outcome::Processed(3));
/// assert_eq!(deliver(&mut conn, "m-1")?, Outcome::Duplicate);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent<C, R, E, F>(conn: &mut C, key: ClaimKey, body: F) -> Result<R, E>
where
    C: Connection,
    C::Backend: InboxBackend,
    R: OnDuplicate,
    E: HandlerError,
    F: FnOnce(&mut C) -> Result<R, E>,
{
    let result = conn.transaction(|conn| match claim(conn, &key)? {
        Claim::Duplicate => Ok(R::on_duplicate()),
        Claim::Claimed => match panic::catch_unwind(AssertUnwindSafe(|| body(conn))) {
            Ok(result) => result.map_err(Failure::Body),
            Err(panic) => Err(Failure::Panic(panic)),
        },
    });
    result.map_err(Failure::into_error)
}

/// Why the transaction rolled back. Diesel only rolls back on `Err`, so a
/// panic in the body is carried out as an error and resumed afterwards.
enum Failure<E> {
    Database(diesel::result::Error),
    Body(E),
    Panic(Box<dyn Any + Send>),
}

impl<E> From<diesel::result::Error> for Failure<E> {
    fn from(error: diesel::result::Error) -> Self {
        Failure::Database(error)
    }
}

impl<E: HandlerError> Failure<E> {
    fn into_error(self) -> E {
        match self {
            Failure::Database(error) => E::from(error),
            Failure::Body(error) => error,
            Failure::Panic(panic) => panic::resume_unwind(panic),
        }
    }
}
