//! Running a handler body exactly once per message id.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

use diesel::connection::{Connection, TransactionManager};

use crate::backend::InboxBackend;
use crate::claim::{claim, retry_claim, Claim};
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
/// - A claim that loses a lock conflict (a MySQL/MariaDB deadlock between
///   deliveries that waited on the same id, or a serialization failure under
///   `SERIALIZABLE`) is retried in a new transaction, up to
///   [`CLAIM_ATTEMPTS`](crate::CLAIM_ATTEMPTS) times in all, since the body
///   has not run yet. Only when `conn` has no transaction open: inside an
///   outer transaction the database has already rolled back the caller's
///   work, so the error is returned.
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
    let outermost = C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()?
        .is_none();
    let mut body = Some(body);
    let mut attempt = 1;
    loop {
        let result = conn.transaction(|conn| match claim(conn, &key).map_err(Failure::Claim)? {
            Claim::Duplicate => Ok(R::on_duplicate()),
            Claim::Claimed => {
                let body = body
                    .take()
                    .expect("the body runs at most once: only after a claim succeeds");
                match panic::catch_unwind(AssertUnwindSafe(|| body(conn))) {
                    Ok(result) => result.map_err(Failure::Body),
                    Err(panic) => Err(Failure::Panic(panic)),
                }
            }
        });
        match result {
            Err(Failure::Claim(error)) if outermost && retry_claim(&error, attempt) => attempt += 1,
            result => return result.map_err(Failure::into_error),
        }
    }
}

/// Why the transaction rolled back. Diesel only rolls back on `Err`, so a
/// panic in the body is carried out as an error and resumed afterwards.
enum Failure<E> {
    /// The claim statement failed: the body has not run.
    Claim(diesel::result::Error),
    /// Beginning, committing or rolling back failed.
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
            Failure::Claim(error) | Failure::Database(error) => E::from(error),
            Failure::Body(error) => error,
            Failure::Panic(panic) => panic::resume_unwind(panic),
        }
    }
}
