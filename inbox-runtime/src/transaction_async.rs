//! Idempotent handlers on `diesel-async` (feature `async`).
//!
//! The same claim statement, schema and semantics as the blocking API, for
//! [`AsyncPgConnection`](diesel_async::AsyncPgConnection) and
//! [`AsyncMysqlConnection`](diesel_async::AsyncMysqlConnection), directly or
//! from a deadpool or bb8 pool.

use diesel::QueryResult;
use diesel_async::AsyncConnection;
use futures_util::FutureExt;
use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::attempts::{MaxAttempts, default_max_attempts};
use crate::backend::{InboxBackend, StoredClaimRow};
use crate::batch::current;
use crate::claim::{
    Claim, ClaimStatement, FingerprintedClaimStatement, Taken, claim_from_affected_rows,
    column_binds, duplicate_of, key_binds, refused_or_database, stored_result_refused,
};
use crate::error::{HandlerError, InboxError, into_handler_error};
use crate::execution::{AsyncLevel, RetryPolicy, async_status, require_transaction};
use crate::failure::{self, Failure, NotCommitted, Recorded};
use crate::key::ClaimKey;
use crate::observe::{BodyScope, Delivery, Ending, ending_of_inbox_error};
use crate::outcome::{OnDuplicate, StoredOutcome};
use crate::scope::{Scope, either, report_after_failed_rollback};
use crate::stored::{Encoded, Plain, Reply, StoredResult, Storing, encode_caught};

/// How long the server keeps the transaction of an async handler whose
/// future was dropped, unless changed with
/// [`set_abandoned_transaction_timeout`]: one minute.
///
/// ```
/// assert_eq!(inbox_runtime::DEFAULT_ABANDONED_TRANSACTION_TIMEOUT.as_secs(), 60);
/// ```
pub const DEFAULT_ABANDONED_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// The bound in milliseconds; `u64::MAX`: the default; 0: none.
static ABANDONED_TRANSACTION_TIMEOUT_MS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Bounds how long a dropped async handler future can keep its claim locked
/// (process-wide; [`DEFAULT_ABANDONED_TRANSACTION_TIMEOUT`] until set).
///
/// diesel-async cannot roll back from a destructor, so a handler whose future
/// is dropped leaves its transaction open on the connection, holding the row
/// lock on the claimed id: a redelivery of that id waits for it. A pool that
/// keeps the connection idle (deadpool recycles, and closes, a broken
/// connection only when it hands it out again) would make that wait last
/// indefinitely. So the outermost transaction of every async handler tells
/// the server to end it, and close the connection, once it has been idle for
/// longer than this bound: PostgreSQL through `SET LOCAL
/// idle_in_transaction_session_timeout` (sent with `BEGIN`, no extra round
/// trip), MySQL and MariaDB by lowering the session's `wait_timeout` for the
/// transaction and restoring it at `COMMIT`/`ROLLBACK` (whole seconds,
/// rounded up). A redelivery then waits at most about this long.
///
/// Pick it longer than the longest pause a handler body makes between two
/// statements (an HTTP call awaited inside the transaction counts): a body
/// idle for longer loses its connection, its work rolls back, and the
/// delivery fails with [`Recovery::Reconnect`](crate::Recovery::Reconnect).
/// `None` leaves the server's own settings alone. A handler nested in a
/// transaction of the caller's does not change it: that transaction is the
/// caller's.
///
/// ```
/// use std::time::Duration;
/// inbox_runtime::set_abandoned_transaction_timeout(Some(Duration::from_secs(30)));
/// assert_eq!(inbox_runtime::abandoned_transaction_timeout(), Some(Duration::from_secs(30)));
/// inbox_runtime::set_abandoned_transaction_timeout(None);
/// assert_eq!(inbox_runtime::abandoned_transaction_timeout(), None);
/// # inbox_runtime::set_abandoned_transaction_timeout(Some(inbox_runtime::DEFAULT_ABANDONED_TRANSACTION_TIMEOUT));
/// ```
pub fn set_abandoned_transaction_timeout(limit: Option<Duration>) {
    let millis = match limit {
        // At least a millisecond: zero would mean "no bound" to PostgreSQL.
        Some(limit) => u64::try_from(limit.as_millis())
            .unwrap_or(u64::MAX - 1)
            .clamp(1, u64::MAX - 1),
        None => 0,
    };
    ABANDONED_TRANSACTION_TIMEOUT_MS.store(millis, Ordering::Relaxed);
}

/// The bound set by [`set_abandoned_transaction_timeout`] (or the default).
///
/// ```
/// # use std::time::Duration;
/// assert!(inbox_runtime::abandoned_transaction_timeout().is_some_and(|limit| limit > Duration::ZERO));
/// ```
pub fn abandoned_transaction_timeout() -> Option<Duration> {
    match ABANDONED_TRANSACTION_TIMEOUT_MS.load(Ordering::Relaxed) {
        0 => None,
        u64::MAX => Some(DEFAULT_ABANDONED_TRANSACTION_TIMEOUT),
        millis => Some(Duration::from_millis(millis)),
    }
}

/// Claims `key` inside the transaction open on an async connection; the async
/// twin of [`claim`](crate::claim), with the same statement and rules.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), Box<dyn std::error::Error>> {
/// use diesel_async::AsyncConnection;
/// use inbox_runtime::{claim_async, Claim, ClaimKey, HandlerName};
///
/// let key = ClaimKey::new(HandlerName::new("billing")?, "pay-1")?;
/// let claim = conn
///     .transaction(async |conn| claim_async(conn, &key).await)
///     .await?;
/// assert!(matches!(claim, Claim::Claimed | Claim::Duplicate));
/// # Ok(())
/// # }
/// ```
pub async fn claim_async<C>(conn: &mut C, key: &ClaimKey) -> QueryResult<Claim>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let claim = claim_statement_async(conn, key)
        .await
        .map_err(|error| refused_or_database(key, error))?;
    if claim == Claim::Duplicate && key.fingerprint().is_some() {
        duplicate_of(key, stored_claim_async(conn, key).await?)?;
    }
    Ok(claim)
}

pub(crate) async fn claim_statement_async<C>(conn: &mut C, key: &ClaimKey) -> QueryResult<Claim>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    require_transaction(async_status(conn))?;
    let affected = match key.fingerprint() {
        None => diesel_async::RunQueryDsl::execute(ClaimStatement::new(key), conn).await?,
        Some(fingerprint) => {
            let statement = FingerprintedClaimStatement { key, fingerprint };
            diesel_async::RunQueryDsl::execute(statement, conn).await?
        }
    };
    Ok(claim_from_affected_rows(affected))
}

/// The async twin of [`take`](crate::claim::take).
async fn take_async<C>(
    conn: &mut C,
    outermost: bool,
    key: &ClaimKey,
    read_result: bool,
) -> Result<Taken, InboxError>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let claim = claim_statement_async(conn, key)
        .await
        .map_err(|error| refused_or_database(key, error))?;
    match claim {
        Claim::Claimed => Ok(Taken::Claimed),
        Claim::Duplicate if !outermost && current::is_running(key) => {
            if let Some(fingerprint) = key.fingerprint() {
                store_fingerprint_async(conn, key, fingerprint).await?;
            }
            Ok(Taken::Claimed)
        }
        Claim::Duplicate if key.fingerprint().is_none() && !read_result => {
            Ok(Taken::Duplicate(None))
        }
        Claim::Duplicate => {
            let row = stored_claim_async(conn, key).await?;
            duplicate_of(key, row).map(Taken::Duplicate)
        }
    }
}

/// The async twin of [`store_fingerprint`](crate::claim::store_fingerprint).
async fn store_fingerprint_async<C>(
    conn: &mut C,
    key: &ClaimKey,
    fingerprint: &crate::fingerprint::Fingerprint,
) -> QueryResult<()>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let binds = column_binds(fingerprint.as_bytes(), key);
    let sql = C::Backend::STORED_CLAIM_SQL.store_fingerprint;
    C::Backend::execute_bound_async(conn, sql, &binds)
        .await
        .map(drop)
}

/// The async twin of `claim::stored_claim`.
async fn stored_claim_async<C>(conn: &mut C, key: &ClaimKey) -> QueryResult<Option<StoredClaimRow>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let sql = C::Backend::STORED_CLAIM_SQL;
    let binds = key_binds(key);
    if let Some(row) = C::Backend::load_stored_claim_async(conn, sql.select, &binds)
        .await?
        .pop()
    {
        return Ok(Some(row));
    }
    match sql.archived_select {
        Some((present, archived)) if C::Backend::load_flag_async(conn, present).await? => {
            Ok(C::Backend::load_stored_claim_async(conn, archived, &binds)
                .await?
                .pop())
        }
        _ => Ok(None),
    }
}

/// Runs the async `body` inside one transaction that first claims `key`; the
/// async twin of [`run_idempotent`](crate::run_idempotent), with the same
/// semantics (duplicates skip the body, `Err` and panics at any depth roll
/// back, an ignored failed statement on PostgreSQL is an error, nested calls
/// become savepoints, a failed rollback marks the connection broken, a claim
/// that loses a lock conflict is retried).
/// See [Cancellation](#cancellation) for what happens when the returned
/// future is dropped before it completes.
///
/// `#[idempotent]` on an `async fn` expands to the same steps written out
/// ([`begin_claimed`], then the body, then [`ClaimedTransaction::finish`]), so
/// that the handler's future holds no closure and is `Send` whenever its
/// body is.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{run_idempotent_async, ClaimKey, HandlerName, Outcome};
///
/// let key = ClaimKey::new(HandlerName::new("greeter")?, "m-1")?;
/// let outcome = run_idempotent_async(conn, key, async |_conn| {
///     Ok::<_, inbox_runtime::InboxError>(Outcome::Processed("hello"))
/// })
/// .await?;
/// # Ok(())
/// # }
/// ```
///
/// # Cancellation
///
/// `diesel-async` does not roll back when a transaction's future is dropped:
/// the connection is left inside the open transaction. If a handler's future
/// is dropped before it finishes (a `select!`, a timeout, an aborted task),
/// the inbox marks the connection's transaction manager as broken:
///
/// - nothing was committed, so the id stays unclaimed and a redelivery is
///   processed;
/// - every further transaction on that connection fails with
///   `BrokenTransactionManager` instead of silently nesting inside the
///   abandoned transaction;
/// - deadpool and bb8 refuse to reuse a broken connection: they close it, and
///   closing it makes the server roll the abandoned transaction back and
///   release its locks. bb8 does so when the connection is returned, deadpool
///   when it next recycles it.
///
/// Until the connection is closed, the server keeps the abandoned transaction
/// and the row lock on the claimed id, which makes a redelivery of the same id
/// wait. So the handler's outermost transaction carries a server-side bound
/// ([`set_abandoned_transaction_timeout`], one minute by default): once the
/// transaction has sat idle that long the server ends it and closes the
/// connection, on PostgreSQL and MySQL/MariaDB. A redelivery waits at most
/// about that long, even when a pool keeps the abandoned connection idle (a
/// deadpool pool hands out its other connections first). A connection you
/// hold yourself should still be dropped after a cancellation.
pub async fn run_idempotent_async<C, R, E, F>(conn: &mut C, key: ClaimKey, body: F) -> Result<R, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    R: OnDuplicate,
    E: HandlerError,
    F: AsyncFnOnce(&mut C) -> Result<R, E>,
{
    run_idempotent_async_with(conn, key, default_max_attempts(), body).await
}

/// [`run_idempotent_async`] with the handler's own limit of failed attempts
/// (see [`run_idempotent_with`](crate::run_idempotent_with)).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{run_idempotent_async_with, ClaimKey, HandlerName, MaxAttempts};
///
/// let key = ClaimKey::new(HandlerName::new("greeter")?, "m-1")?;
/// run_idempotent_async_with(conn, key, MaxAttempts::Unbounded, async |_conn| {
///     Ok::<(), inbox_runtime::InboxError>(())
/// })
/// .await?;
/// # Ok(())
/// # }
/// ```
pub async fn run_idempotent_async_with<C, R, E, F>(
    conn: &mut C,
    key: ClaimKey,
    max_attempts: MaxAttempts,
    body: F,
) -> Result<R, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    R: OnDuplicate,
    E: HandlerError,
    F: AsyncFnOnce(&mut C) -> Result<R, E>,
{
    run_async::<Plain, C, R, E, F>(conn, key, max_attempts, body).await
}

/// [`run_idempotent_async_with`] for request/response handlers: the async
/// twin of [`run_idempotent_storing`](crate::run_idempotent_storing).
///
/// ```no_run
/// # #[cfg(all(feature = "postgres", feature = "serde"))]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{run_idempotent_async_storing, ClaimKey, HandlerName, MaxAttempts, StoredOutcome};
///
/// let key = ClaimKey::new(HandlerName::new("payments.charge")?, "req-1")?;
/// let receipt = run_idempotent_async_storing(conn, key, MaxAttempts::Unbounded, async |_conn| {
///     Ok::<_, inbox_runtime::InboxError>(StoredOutcome::Processed(String::from("receipt-1")))
/// })
/// .await?;
/// assert_eq!(receipt.value().as_deref(), Some("receipt-1"));
/// # Ok(())
/// # }
/// ```
pub async fn run_idempotent_async_storing<C, T, E, F>(
    conn: &mut C,
    key: ClaimKey,
    max_attempts: MaxAttempts,
    body: F,
) -> Result<StoredOutcome<T>, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    StoredOutcome<T>: StoredResult,
    E: HandlerError,
    F: AsyncFnOnce(&mut C) -> Result<StoredOutcome<T>, E>,
{
    run_async::<Storing, C, StoredOutcome<T>, E, F>(conn, key, max_attempts, body).await
}

async fn run_async<P, C, R, E, F>(
    conn: &mut C,
    key: ClaimKey,
    max_attempts: MaxAttempts,
    body: F,
) -> Result<R, E>
where
    P: Reply<R>,
    C: AsyncConnection,
    C::Backend: InboxBackend,
    E: HandlerError,
    F: AsyncFnOnce(&mut C) -> Result<R, E>,
{
    let begun = claim_in_new_level::<P, C, R>(conn, key, max_attempts).await;
    let mut claimed = match begun.map_err(into_handler_error::<E>)? {
        Begun::Claimed(claimed) => claimed,
        Begun::Duplicate(answer) => return Ok(answer),
    };
    let scope = claimed.observed();
    let result = scope
        .instrument(AssertUnwindSafe(body(claimed.conn())).catch_unwind())
        .await;
    claimed.finish_replying::<P, R, E>(result).await
}

/// Begins a transaction on `conn` and claims `key` in it.
///
/// `None`: the id was already claimed; the transaction is over and nothing
/// was written. `Some`: the id is claimed in the open transaction, where the
/// message's effects go; end it with [`ClaimedTransaction::finish`]. A claim
/// that loses a lock conflict is retried as in
/// [`run_idempotent`](crate::run_idempotent).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use diesel_async::RunQueryDsl;
/// use inbox_runtime::{begin_claimed, ClaimKey, HandlerName};
///
/// let key = ClaimKey::new(HandlerName::new("billing")?, "pay-1")?;
/// if let Some(mut claimed) = begin_claimed(conn, &key).await? {
///     let effect = diesel::sql_query("UPDATE account SET cents = cents + 250")
///         .execute(claimed.conn())
///         .await
///         .map(drop);
///     claimed.finish(effect).await?;
/// }
/// # Ok(())
/// # }
/// ```
pub async fn begin_claimed<'c, C>(
    conn: &'c mut C,
    key: &ClaimKey,
) -> QueryResult<Option<ClaimedTransaction<'c, C>>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    match claim_in_new_level::<Plain, C, ()>(conn, key.clone(), default_max_attempts()).await {
        Ok(Begun::Claimed(claimed)) => Ok(Some(claimed)),
        Ok(Begun::Duplicate(())) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// What beginning a claimed transaction came to: the transaction, or the
/// answer to a duplicate (`R::on_duplicate()`, or the stored result).
// Built once per delivery and taken apart at once: boxing the transaction
// would cost an allocation per delivery to save a move.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Begun<'c, C: AsyncConnection, R> {
    /// The id is claimed in the open transaction.
    Claimed(ClaimedTransaction<'c, C>),
    /// The id was already claimed: the body does not run.
    Duplicate(R),
}

/// [`begin_claimed`], with the inbox's own errors kept typed (for handlers
/// whose error type takes them).
pub(crate) async fn claim_in_new_level<'c, P, C, R>(
    conn: &'c mut C,
    key: ClaimKey,
    max_attempts: MaxAttempts,
) -> Result<Begun<'c, C, R>, InboxError>
where
    P: Reply<R>,
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut delivery = Delivery::start(&key);
    let scope =
        match Scope::bounded::<C::Backend>(async_status(conn), abandoned_transaction_timeout()) {
            Ok(scope) => scope,
            Err(error) => {
                delivery.finish(&key, Ending::DatabaseError { error: &error });
                return Err(error.into());
            }
        };
    let mut transaction = ClaimedTransaction {
        level: AsyncLevel::new(conn, scope),
        key,
        max_attempts,
        delivery: None,
    };
    let claim = delivery
        .scope()
        .instrument(transaction.claim(&delivery, P::STORES))
        .await;
    match claim {
        Ok(Taken::Claimed) => {
            delivery.claimed();
            transaction.delivery = Some(delivery);
            Ok(Begun::Claimed(transaction))
        }
        Ok(Taken::Duplicate(stored)) => {
            delivery.claimed();
            let answer = P::duplicate(&transaction.key, stored.as_deref());
            match &answer {
                Ok(_) => delivery.finish(&transaction.key, Ending::Duplicate),
                Err(error) => delivery.finish(&transaction.key, ending_of_inbox_error(error)),
            }
            answer.map(Begun::Duplicate)
        }
        Err(error) => {
            if error.is_conflict() {
                // A claim that found its id taken, as a duplicate does.
                delivery.claimed();
            }
            delivery.finish(&transaction.key, ending_of_inbox_error(&error));
            Err(error)
        }
    }
}

/// A transaction open on a connection, holding a fresh claim: the message is
/// being processed for the first time. Its effects go through
/// [`conn`](Self::conn); [`finish`](Self::finish) commits them with the claim
/// or rolls both back.
///
/// Dropping it unfinished (the handler's future was cancelled) marks the
/// connection's transaction manager as broken: see
/// [`run_idempotent_async`](crate::run_idempotent_async#cancellation).
#[must_use = "the claim's transaction stays open until `finish` commits or rolls it back"]
pub struct ClaimedTransaction<'c, C: AsyncConnection> {
    /// The connection and the level open on it (the handler's, or the
    /// short transaction that records a failure), marked broken if this is
    /// dropped between the level's `BEGIN` (or savepoint) and the end of its
    /// commit or rollback.
    level: AsyncLevel<'c, C>,
    key: ClaimKey,
    max_attempts: MaxAttempts,
    /// Reported when the delivery ends.
    delivery: Option<Delivery>,
}

impl<C> ClaimedTransaction<'_, C>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    /// Begins the handler's level and claims the key in it, retrying a claim
    /// that lost a lock conflict (outermost level only). Returns with the
    /// level open when the key was claimed, and closed (committed) on a
    /// duplicate.
    async fn claim(&mut self, delivery: &Delivery, read_result: bool) -> Result<Taken, InboxError> {
        let mut tries = RetryPolicy::CLAIM.tries();
        loop {
            self.level.begin().await?;
            let outermost = self.level.scope.is_outermost();
            match take_async(self.level.conn(), outermost, &self.key, read_result).await {
                Ok(Taken::Claimed) => return Ok(Taken::Claimed),
                Ok(Taken::Duplicate(stored)) => {
                    self.level.commit().await?;
                    return Ok(Taken::Duplicate(stored));
                }
                Err(error) => {
                    if let Err(rollback_error) = self.level.roll_back().await {
                        return Err(either(report_after_failed_rollback(error, rollback_error)));
                    }
                    match error {
                        // Claims retry at once (the policy's wait is zero).
                        InboxError::Database(cause)
                            if outermost && tries.again(&cause).is_some() =>
                        {
                            delivery.claim_retry(&self.key, tries.made(), &cause);
                        }
                        error => return Err(error),
                    }
                }
            }
        }
    }

    /// Ends the transaction after the inbox's own step after a successful
    /// body failed with `error` (storing its result): rolls it back and
    /// reports the delivery, without recording a failed attempt (the body
    /// did not fail). Returns what the delivery fails with.
    pub(crate) async fn abandon(mut self, error: InboxError) -> InboxError {
        let scope = self.observed();
        scope
            .instrument(async move {
                let error = match self.level.roll_back().await {
                    Ok(()) => error,
                    Err(rollback_error) => {
                        either(report_after_failed_rollback(error, rollback_error))
                    }
                };
                self.report(ending_of_inbox_error(&error));
                error
            })
            .await
    }

    /// Ends the transaction after the body returned `result` (under
    /// `catch_unwind`): stores the `Ok` value's result first when `P` says
    /// so, then [`finish_or_resume`](Self::finish_or_resume). The value is
    /// encoded under the same watch as the body: a panicking `Serialize` is
    /// the delivery's panic (rolled back, counted, resumed); a result that
    /// cannot be stored rolls the delivery back without counting an attempt
    /// ([`abandon`](Self::abandon)).
    pub(crate) async fn finish_replying<P, R, E>(
        mut self,
        result: Result<Result<R, E>, Box<dyn Any + Send>>,
    ) -> Result<R, E>
    where
        P: Reply<R>,
        E: HandlerError,
    {
        let result = match result {
            Ok(Ok(value)) => match encode_caught::<P, R>(&self.key, &value) {
                Ok(encoded) => {
                    if let Err(error) = self.store(encoded).await {
                        return Err(into_handler_error(self.abandon(error).await));
                    }
                    Ok(Ok(value))
                }
                Err(panic) => Err(panic),
            },
            other => other,
        };
        self.finish_or_resume(result).await
    }

    /// Stores the encoded result with the claim (a handler that stores
    /// results): before the commit, in the claim's transaction.
    async fn store(&mut self, encoded: Encoded) -> Result<(), InboxError> {
        let Some(result) = encoded? else {
            return Ok(());
        };
        let binds = column_binds(&result, &self.key);
        let sql = C::Backend::STORED_CLAIM_SQL.store_result;
        C::Backend::execute_bound_async(self.level.conn(), sql, &binds)
            .await
            .map_err(stored_result_refused)?;
        Ok(())
    }

    /// The transaction's connection, for the message's effects.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo(mut claimed: inbox_runtime::ClaimedTransaction<'_, diesel_async::AsyncPgConnection>) {
    /// let _conn: &mut diesel_async::AsyncPgConnection = claimed.conn();
    /// # }
    /// ```
    pub fn conn(&mut self) -> &mut C {
        self.level.conn()
    }

    /// Ends the transaction by the body's result: commits the claim and the
    /// effects on `Ok`, rolls both back on `Err` and returns the body's
    /// error. A commit or rollback that fails is reported instead (see
    /// [`InboxError`]: an ignored failed statement, a transaction the
    /// database had already rolled back), carried in a Diesel error that
    /// [`InboxError::find_in`] recovers.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo(claimed: inbox_runtime::ClaimedTransaction<'_, diesel_async::AsyncPgConnection>) -> diesel::QueryResult<()> {
    /// claimed.finish(Ok::<(), diesel::result::Error>(())).await
    /// # }
    /// ```
    pub async fn finish<R, E>(self, result: Result<R, E>) -> Result<R, E>
    where
        E: From<diesel::result::Error> + std::error::Error + 'static,
    {
        let scope = self.observed();
        match scope.instrument(self.end(result)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(Failed::Body(error))) => Err(error),
            Ok(Err(Failed::Inbox(error))) | Err(error) => Err(E::from(error.into())),
        }
    }

    /// [`finish`](Self::finish) for a body run under `catch_unwind`: a panic
    /// rolls back, then resumes (even when the rollback fails, which marks
    /// the connection broken).
    pub(crate) async fn finish_or_resume<R, E>(
        self,
        result: Result<Result<R, E>, Box<dyn Any + Send>>,
    ) -> Result<R, E>
    where
        E: HandlerError,
    {
        let scope = self.observed();
        scope.instrument(self.end_or_resume(result)).await
    }

    /// What the delivery's parts after the claim run in: its span (feature
    /// `tracing`).
    pub(crate) fn observed(&self) -> BodyScope {
        self.delivery
            .as_ref()
            .map_or_else(BodyScope::none, Delivery::scope)
    }

    async fn end_or_resume<R, E>(
        mut self,
        result: Result<Result<R, E>, Box<dyn Any + Send>>,
    ) -> Result<R, E>
    where
        E: HandlerError,
    {
        match result {
            Ok(result) => match self.end(result).await {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(Failed::Body(error))) => Err(error),
                Ok(Err(Failed::Inbox(error))) | Err(error) => Err(into_handler_error(error)),
            },
            Err(panic) => {
                // The panic matters more than a failed rollback, which marks
                // the connection broken anyway, or than a count that could
                // not be written.
                match self.level.roll_back().await {
                    Ok(()) => {
                        let failure = Failure::of_panic(&*panic);
                        let recorded = self.record_failure(&failure).await;
                        self.report(match &recorded {
                            Ok(Some(recorded)) => recorded.ending(&failure),
                            _ => Ending::Failed { attempts: None },
                        });
                    }
                    Err(rollback_error) => self.report(Ending::DatabaseError {
                        error: &rollback_error,
                    }),
                }
                panic::resume_unwind(panic)
            }
        }
    }

    /// Commits on `Ok`; on `Err`, rolls back and records the failure. The
    /// outer `Err` is a commit or rollback that failed.
    async fn end<R, E>(mut self, result: Result<R, E>) -> Result<Result<R, Failed<E>>, InboxError>
    where
        E: std::error::Error + 'static,
    {
        match result {
            Ok(value) => match self.level.commit().await.map_err(NotCommitted::of_commit) {
                Ok(()) => {
                    self.report(Ending::Processed);
                    Ok(Ok(value))
                }
                Err(NotCommitted::Refused(refusal)) => {
                    Err(match self.after_failure(refusal).await {
                        Failed::Inbox(replacement) => replacement,
                        Failed::Body(refusal) => InboxError::Database(refusal),
                    })
                }
                Err(NotCommitted::Failed(error)) => {
                    self.report(Ending::DatabaseError { error: &error });
                    Err(error)
                }
            },
            Err(error) => match self.level.roll_back().await {
                Ok(()) => Ok(Err(self.after_failure(error).await)),
                Err(rollback_error) => {
                    self.report(Ending::DatabaseError {
                        error: &rollback_error,
                    });
                    report_after_failed_rollback(error, rollback_error)
                        .map(|error| Err(Failed::Body(error)))
                }
            },
        }
    }

    /// After the body failed with `error` and its level rolled back: records
    /// the failure, and says what the delivery fails with.
    async fn after_failure<E>(&mut self, error: E) -> Failed<E>
    where
        E: std::error::Error + 'static,
    {
        let failure = Failure::of_error(&error);
        let recorded = match &failure {
            Some(failure) => self.record_failure(failure).await,
            None => Ok(None),
        };
        let replacement =
            failure::conclude(failure.as_ref(), recorded, |ending| self.report(ending));
        match replacement {
            Some(replacement) => Failed::Inbox(replacement),
            None => Failed::Body(error),
        }
    }

    /// Records a failed body after its rollback, in a short transaction of
    /// its own (see `failure.rs`). `None`: nothing to record at this level (a
    /// nested handler: its caller's transaction is still open).
    async fn record_failure(&mut self, failure: &Failure) -> Result<Option<Recorded>, InboxError> {
        if !self.level.scope.is_outermost() {
            return Ok(None);
        }
        let short = Scope::new::<C::Backend>(async_status(self.level.conn()))?;
        let handler_scope = std::mem::replace(&mut self.level.scope, short);
        let recorded = match self.record_in_short_transaction(failure).await {
            Err(error) => match failure::retry_in_ascii(&error, failure) {
                Some(ascii) => self.record_in_short_transaction(&ascii).await,
                None => Err(error),
            },
            recorded => recorded,
        };
        self.level.scope = handler_scope;
        recorded.map(Some)
    }

    async fn record_in_short_transaction(
        &mut self,
        failure: &Failure,
    ) -> Result<Recorded, InboxError> {
        self.level.begin().await?;
        match self.write_failure(failure).await {
            Ok(Recorded::ProcessedMeanwhile) => {
                self.level.roll_back().await?;
                Ok(Recorded::ProcessedMeanwhile)
            }
            Ok(recorded) => {
                self.level.commit().await?;
                Ok(recorded)
            }
            Err(error) => {
                self.level.roll_back().await?;
                Err(error)
            }
        }
    }

    async fn write_failure(&mut self, failure: &Failure) -> Result<Recorded, InboxError> {
        let record = failure::record_attempt_binds(&self.key, failure);
        C::Backend::execute_bound_async(
            self.level.conn(),
            C::Backend::FAILURE_SQL.record_attempt,
            &record,
        )
        .await?;
        let rows = match failure::mark_dead::<C::Backend>(&self.key, failure, self.max_attempts) {
            Some((sql, binds)) => {
                Some(C::Backend::execute_bound_async(self.level.conn(), sql, &binds).await?)
            }
            None => None,
        };
        let recorded = failure::recorded(failure, self.max_attempts, rows);
        if recorded.claims() {
            let claim = claim_statement_async(self.level.conn(), &self.key)
                .await
                .map_err(|error| refused_or_database(&self.key, error))?;
            if claim == Claim::Duplicate {
                return Ok(Recorded::ProcessedMeanwhile);
            }
        }
        Ok(recorded)
    }

    /// Reports how the delivery ended (once).
    fn report(&mut self, ending: Ending<'_>) {
        if let Some(delivery) = self.delivery.take() {
            delivery.finish(&self.key, ending);
        }
    }
}

/// What a failed body's delivery fails with: the body's own error, or an
/// inbox error in its place (exhausted attempts, a rejection that could not
/// be recorded).
enum Failed<E> {
    Body(E),
    Inbox(InboxError),
}
