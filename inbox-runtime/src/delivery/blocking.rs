//! The blocking front end: the delivery core driven on the calling thread
//! over a blocking Diesel connection, whose every step is done when it is
//! called ([`Blocking`]).

use std::future::{Ready, ready};
use std::time::Duration;

use diesel::QueryResult;
use diesel::connection::{LoadConnection, TransactionManager, TransactionManagerStatus};

use super::executor::Executor;
use super::single::deliver;
use super::steps::claim_checked;
use crate::backend::shaped::by_shape;
use crate::backend::{
    BatchClaimed, Bind, ClaimBound, InboxBackend, ReadingClaimRow, StoredClaimRow,
};
use crate::claim::{
    BoundedClaimStatement, Claim, ClaimCheckStatement, ClaimStatement, FingerprintedClaimStatement,
    TokenClaimStatement,
};
use crate::error::HandlerError;
use crate::execution::block_ready;
use crate::key::ClaimKey;
use crate::options::Options;
use crate::outcome::{OnDuplicate, StoredOutcome};
use crate::scope::Scope;
use crate::stored::{Plain, Reply, StoredResult, Storing};

/// Runs `body` inside one transaction that first claims `key`, unless the key
/// was already claimed. This is what `#[idempotent]` expands to.
///
/// - A first delivery: the id is claimed, `body` runs on the transaction's
///   connection, and the claim commits together with the body's effects.
/// - A duplicate: `body` does not run and nothing is written; the result is
///   `Ok(R::on_duplicate())` (`()` or [`Outcome::Duplicate`](crate::Outcome)).
/// - `body` returns `Err` or panics: everything rolls back, the claim
///   included, so a redelivery processes the message again. A panic is
///   resumed after the rollback, also when the rollback itself fails. A
///   panic inside a Diesel transaction the body opened (whose savepoint
///   Diesel leaves open on unwinding) rolls back everything the handler did
///   all the same, and the connection is back at the depth the handler found
///   it.
/// - `body` returns `Ok` but PostgreSQL aborted the transaction (a statement
///   failed and the body ignored its error): nothing could commit, and the
///   result is [`InboxError::IgnoredStatementFailure`](crate::InboxError::IgnoredStatementFailure) (retryable), never
///   `Ok`. The check travels with the `COMMIT`, in the same round trip.
/// - `body` returns `Ok` but the `COMMIT` is refused by a constraint the
///   database checks at commit (a deferred foreign key or unique key, on
///   PostgreSQL or SQLite): nothing committed, and the refusal is the
///   message's failed attempt, counted as a failed body's (see below): its
///   writes fail the same way on every delivery, so it ends dead instead of
///   being retried forever. The connection stays usable.
/// - Called inside a transaction already open on `conn`, the work becomes a
///   savepoint (`inbox_savepoint_<depth>`): the claim is final only when the
///   outer transaction commits, and vanishes with it if it rolls back.
/// - A rollback that fails (the connection died, or MySQL/MariaDB rolled
///   back the whole transaction on a deadlock, the caller's outer one
///   included) is [`InboxError::TransactionLost`](crate::InboxError::TransactionLost), and the connection's
///   transaction manager is marked broken: every later transaction on it
///   fails with `BrokenTransactionManager` instead of running outside any
///   transaction. Replace the connection (r2d2 discards a broken one).
/// - A claim that loses a lock conflict (a MySQL/MariaDB deadlock between
///   deliveries that waited on the same id, or a serialization failure under
///   `SERIALIZABLE`; see [`is_lock_conflict`](crate::is_lock_conflict)) is
///   retried in a new transaction, up to
///   [`CLAIM_ATTEMPTS`](crate::CLAIM_ATTEMPTS) times in all, since the body
///   has not run yet. Only when `conn` has no transaction open: inside an
///   outer transaction the conflict is returned to the caller.
/// - `body` fails (returns its own error or panics) in a handler that opened
///   the outermost transaction: after the rollback, the failed attempt is
///   counted in a short transaction of its own, and at the default
///   [`MaxAttempts`](crate::MaxAttempts) the message is recorded as dead and
///   the delivery fails with [`InboxError::AttemptsExhausted`](crate::InboxError::AttemptsExhausted); a body that
///   returns [`InboxError::rejected`](crate::InboxError::rejected) makes the message dead at once. See
///   [`run_idempotent_with`] for the limit, and
///   [`dead_letters`](crate::dead_letters) for what operators can do.
/// - What to do with an error: [`ack_decision`](crate::ack_decision) turns
///   the result into the broker's decision; [`InboxError::recovery`](crate::InboxError::recovery) and
///   [`recovery`](crate::recovery) say retry, reconnect, or never.
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
    C: LoadConnection,
    C::Backend: InboxBackend,
    R: OnDuplicate,
    E: HandlerError,
    F: FnOnce(&mut C) -> Result<R, E>,
{
    run_idempotent_with(conn, key, Options::new(), body)
}

/// [`run_idempotent`] with the handler's own [`Options`] (what
/// `#[idempotent(max_attempts = …)]` expands to) instead of the process
/// defaults: a [`MaxAttempts`](crate::MaxAttempts) converts into options
/// that set the limit of failed attempts.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{run_idempotent_with, ClaimKey, HandlerName, InboxError, MaxAttempts};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let key = || ClaimKey::new(HandlerName::new("flaky")?, "m-1");
/// let fail = |_: &mut SqliteConnection| Err::<(), _>(diesel::result::Error::NotFound);
///
/// let first = run_idempotent_with(&mut conn, key()?, MaxAttempts::limit(2), fail);
/// assert!(matches!(first, Err(diesel::result::Error::NotFound)), "counted, may retry");
/// let second = run_idempotent_with(&mut conn, key()?, MaxAttempts::limit(2), fail).unwrap_err();
/// assert!(matches!(
///     InboxError::find_in(&second),
///     Some(InboxError::AttemptsExhausted { attempts: 2, .. })
/// ));
/// // Dead: the body no longer runs.
/// let third = run_idempotent_with(&mut conn, key()?, MaxAttempts::limit(2), |_: &mut SqliteConnection| -> QueryResult<()> {
///     unreachable!("a dead message's body does not run")
/// });
/// assert!(third.is_ok());
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_with<C, R, E, F>(
    conn: &mut C,
    key: ClaimKey,
    options: impl Into<Options>,
    body: F,
) -> Result<R, E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    R: OnDuplicate,
    E: HandlerError,
    F: FnOnce(&mut C) -> Result<R, E>,
{
    run::<Plain, C, R, E, F>(conn, key, options.into(), body)
}

/// [`run_idempotent_with`] for request/response handlers: the body's
/// result is stored with the claim (as JSON, at most
/// [`MAX_STORED_RESULT_BYTES`](crate::MAX_STORED_RESULT_BYTES)) and a later
/// delivery of the same id returns it as [`StoredOutcome::Replayed`] without
/// running the body. `#[idempotent(store_result)]` expands to it (feature
/// `serde`; see [`StoredResult`]).
///
/// A result that cannot be stored (too large, or not encodable) fails the
/// delivery with [`InboxError::StoredResult`](crate::InboxError::StoredResult) and rolls its effects back:
/// a claim is never committed without the result its duplicates replay.
///
/// ```
/// # #[cfg(all(feature = "sqlite", feature = "serde"))] {
/// use diesel::prelude::*;
/// use inbox_runtime::{run_idempotent_storing, ClaimKey, HandlerName, MaxAttempts, StoredOutcome};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let mut charge = |conn: &mut SqliteConnection, amount: u32| {
///     let key = ClaimKey::new(HandlerName::new("payments.charge")?, "req-1")?;
///     run_idempotent_storing(conn, key, MaxAttempts::Unbounded, |_conn| {
///         Ok::<_, inbox_runtime::InboxError>(StoredOutcome::Processed(format!("charged {amount}")))
///     })
/// };
/// assert_eq!(charge(&mut conn, 250)?, StoredOutcome::Processed("charged 250".to_owned()));
/// // The retry gets the first delivery's result; its body does not run.
/// assert_eq!(charge(&mut conn, 250)?, StoredOutcome::Replayed("charged 250".to_owned()));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_storing<C, T, E, F>(
    conn: &mut C,
    key: ClaimKey,
    options: impl Into<Options>,
    body: F,
) -> Result<StoredOutcome<T>, E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    StoredOutcome<T>: StoredResult,
    E: HandlerError,
    F: FnOnce(&mut C) -> Result<StoredOutcome<T>, E>,
{
    run::<Storing, C, StoredOutcome<T>, E, F>(conn, key, options.into(), body)
}

/// The runner: [`Plain`] or [`Storing`] decides what a duplicate returns
/// and what is stored after the body.
pub(crate) fn run<P, C, R, E, F>(
    conn: &mut C,
    key: ClaimKey,
    options: Options,
    body: F,
) -> Result<R, E>
where
    P: Reply<R>,
    C: LoadConnection,
    C::Backend: InboxBackend,
    E: HandlerError,
    F: FnOnce(&mut C) -> Result<R, E>,
{
    let mut exec = Blocking::new(conn);
    block_ready(deliver::<P, R, E, _, _>(
        &mut exec,
        key,
        options,
        async |conn: &mut C| body(conn),
    ))
}

/// Claims `key` inside the transaction open on `conn`.
///
/// The row becomes durable only when the caller's transaction commits, together
/// with the effects written through the same connection; if the transaction
/// rolls back, the id is free again and a redelivery is processed. A delivery
/// of the same key racing on another connection waits for this transaction to
/// finish.
///
/// A key carrying the payload's fingerprint
/// ([`ClaimKey::with_fingerprint`]) stores it with a new claim; on a
/// duplicate it is compared with the one stored, and another fingerprint is
/// refused with [`InboxError::Conflict`](crate::InboxError::Conflict) (as
/// `diesel::result::Error::QueryBuilderError`, which
/// [`recovery`](crate::recovery) and [`ack_decision`](crate::ack_decision)
/// read as the inbox error it carries: dead-letter).
///
/// Calling it outside a transaction is refused with
/// `diesel::result::Error::NotInTransaction`: a claim committed on its own,
/// apart from the effects, is exactly the mistake the inbox exists to prevent.
/// [`run_idempotent`](crate::run_idempotent) (what `#[idempotent]` expands to)
/// opens the transaction for you.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::{Connection, SqliteConnection};
/// use inbox_runtime::{claim, Claim, ClaimKey, HandlerName};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let key = ClaimKey::new(HandlerName::new("billing")?, "pay-1")?;
///
/// assert!(claim(&mut conn, &key).is_err(), "outside a transaction");
/// conn.transaction(|conn| {
///     assert_eq!(claim(conn, &key)?, Claim::Claimed);
///     assert_eq!(claim(conn, &key)?, Claim::Duplicate);
///     diesel::QueryResult::Ok(())
/// })?;
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn claim<C>(conn: &mut C, key: &ClaimKey) -> QueryResult<Claim>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    block_ready(claim_checked(&mut Blocking::new(conn), key))
}

/// A blocking connection as the delivery core's [`Executor`]: each step
/// runs its statement when called and returns it ready.
pub(crate) struct Blocking<'c, C> {
    conn: &'c mut C,
}

impl<'c, C> Blocking<'c, C> {
    /// Executes on `conn`.
    pub(crate) fn new(conn: &'c mut C) -> Self {
        Blocking { conn }
    }
}

// Each step returns `Ready`, refining the trait's `impl Future`: what makes
// a blocking delivery complete in one poll.
#[allow(refining_impl_trait)]
impl<C> Executor for Blocking<'_, C>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    type Backend = C::Backend;
    type Conn = C;

    fn conn(&mut self) -> &mut C {
        self.conn
    }

    fn status(&mut self) -> &mut TransactionManagerStatus {
        C::TransactionManager::transaction_manager_status_mut(self.conn)
    }

    fn idle_limit(&self) -> Option<Duration> {
        None
    }

    fn set_open(&mut self, _open: bool) {}

    fn pays_per_statement(&self, scope: &Scope) -> bool {
        scope.sends_statements_one_by_one()
    }

    fn level_sql(&mut self, scope: &Scope, sql: &str) -> Ready<QueryResult<()>> {
        ready(scope.execute(self.conn, sql))
    }

    fn claim(
        &mut self,
        key: &ClaimKey,
        bound: Option<ClaimBound>,
        token: bool,
    ) -> Ready<QueryResult<usize>> {
        use diesel::RunQueryDsl;
        if token {
            let statement = TokenClaimStatement { key, bound };
            return ready(by_shape!(C::Backend, statement, |claim| claim.execute(self.conn)));
        }
        ready(match (bound, key.fingerprint()) {
            (Some(bound), _) => {
                by_shape!(C::Backend, BoundedClaimStatement { key, bound }, |claim| {
                    claim.execute(self.conn)
                })
            }
            (None, None) => ClaimStatement::new(key).execute(self.conn),
            (None, Some(fingerprint)) => {
                FingerprintedClaimStatement { key, fingerprint }.execute(self.conn)
            }
        })
    }

    fn commit_claim_checked(&mut self, key: &ClaimKey) -> Ready<QueryResult<()>> {
        use diesel::RunQueryDsl;
        ready(ClaimCheckStatement { key }.execute(self.conn).map(drop))
    }

    fn claim_reading(
        &mut self,
        key: &ClaimKey,
        bound: Option<ClaimBound>,
    ) -> Ready<QueryResult<Vec<ReadingClaimRow>>> {
        ready(C::Backend::load_reading_claim(self.conn, key, bound))
    }

    fn execute_bound(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> Ready<QueryResult<usize>> {
        ready(C::Backend::execute_cached(self.conn, sql, binds))
    }

    fn load_stored_claim(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> Ready<QueryResult<Vec<StoredClaimRow>>> {
        ready(C::Backend::load_stored_claim(self.conn, sql, binds))
    }

    fn load_flag(&mut self, sql: &'static str) -> Ready<QueryResult<bool>> {
        ready(C::Backend::load_flag(self.conn, sql))
    }

    fn claim_batch(
        &mut self,
        handler: &str,
        ids: &[&str],
        bound: Option<&ClaimBound>,
    ) -> Ready<QueryResult<BatchClaimed>> {
        ready(C::Backend::claim_batch(self.conn, handler, ids, bound))
    }
}
