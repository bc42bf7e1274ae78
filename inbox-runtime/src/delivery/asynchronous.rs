//! The async front end (feature `async`): the delivery core on
//! diesel-async connections ([`AsyncPgConnection`](diesel_async::AsyncPgConnection),
//! [`AsyncMysqlConnection`](diesel_async::AsyncMysqlConnection), directly or
//! from a deadpool or bb8 pool), with the drop guard that marks a
//! connection broken when a future is dropped inside its transaction.

use std::time::Duration;

use diesel::QueryResult;
use diesel::connection::TransactionManagerStatus;
use diesel_async::{AsyncConnection, TransactionManager};

use super::executor::Executor;
use super::single::{Begun, BodyRan, BodyStart, Claimed, begin, deliver};
use super::steps::claim_checked;
use crate::backend::shaped::by_shape;
use crate::backend::{
    BatchClaimed, Bind, ClaimBound, InboxBackend, ReadingClaimRow, StoredClaimRow,
};
use crate::claim::{
    BoundedClaimStatement, Claim, ClaimCheckStatement, ClaimStatement, FingerprintedClaimStatement,
    TokenClaimStatement,
};
use crate::error::{HandlerError, InboxError};
use crate::execution::OpenTransactionGuard;
use crate::key::ClaimKey;
use crate::options::{Options, abandoned_transaction_timeout};
use crate::outcome::{OnDuplicate, StoredOutcome};
use crate::scope::{HeldBegin, Scope};
use crate::stored::{Plain, Reply, StoredResult, Storing};

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
    claim_checked(&mut Async::new(conn), key).await
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
/// This function sends `BEGIN`, then the claim, on any connection. An
/// `#[idempotent]` handler that names `AsyncPgConnection` as its
/// connection's type sends the two in one flight
/// instead, with a claim that refuses to run outside the transaction block
/// that `BEGIN` opens: one round trip fewer per delivery (the guide's
/// "Async handlers" chapter).
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
/// ([`set_abandoned_transaction_timeout`](crate::set_abandoned_transaction_timeout), one minute by default): once the
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
    run_idempotent_async_with(conn, key, Options::new(), body).await
}

/// [`run_idempotent_async`] with the handler's own [`Options`] (see
/// [`run_idempotent_with`](crate::run_idempotent_with)).
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
    options: impl Into<Options>,
    body: F,
) -> Result<R, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    R: OnDuplicate,
    E: HandlerError,
    F: AsyncFnOnce(&mut C) -> Result<R, E>,
{
    run_async::<Plain, C, R, E, F>(conn, key, options.into(), body).await
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
    options: impl Into<Options>,
    body: F,
) -> Result<StoredOutcome<T>, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    StoredOutcome<T>: StoredResult,
    E: HandlerError,
    F: AsyncFnOnce(&mut C) -> Result<StoredOutcome<T>, E>,
{
    run_async::<Storing, C, StoredOutcome<T>, E, F>(conn, key, options.into(), body).await
}

pub(crate) async fn run_async<P, C, R, E, F>(
    conn: &mut C,
    key: ClaimKey,
    options: Options,
    body: F,
) -> Result<R, E>
where
    P: Reply<R>,
    C: AsyncConnection,
    C::Backend: InboxBackend,
    E: HandlerError,
    F: AsyncFnOnce(&mut C) -> Result<R, E>,
{
    deliver::<P, R, E, _, _>(&mut Async::new(conn), key, options, body).await
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
    match claim_in_new_level::<Plain, C, ()>(conn, key.clone(), Options::new()).await {
        Ok(Begun::Claimed(claimed)) => Ok(Some(claimed)),
        Ok(Begun::Answered(())) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// [`begin_claimed`], with the inbox's own errors kept typed (for handlers
/// whose error type takes them) and a duplicate's answer (`R::on_duplicate()`,
/// or the stored result).
pub(crate) async fn claim_in_new_level<'c, P, C, R>(
    conn: &'c mut C,
    key: ClaimKey,
    options: Options,
) -> Result<Begun<R, ClaimedTransaction<'c, C>>, InboxError>
where
    P: Reply<R>,
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let mut exec = Async::new(conn);
    Ok(match begin::<P, R, _>(&mut exec, key, options).await? {
        Begun::Claimed(claimed) => Begun::Claimed(ClaimedTransaction::new(exec, claimed)),
        Begun::Answered(answer) => Begun::Answered(answer),
    })
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
    /// The connection, guarded from the level's `BEGIN` (or savepoint) to
    /// the end of its commit or rollback.
    exec: Async<'c, C>,
    /// The claim's level, and the delivery it belongs to.
    claimed: Claimed,
}

impl<'c, C: AsyncConnection> ClaimedTransaction<'c, C> {
    /// The transaction `claimed` holds, open on `exec`.
    pub(crate) fn new(exec: Async<'c, C>, claimed: Claimed) -> Self {
        ClaimedTransaction { exec, claimed }
    }
}

impl<C> ClaimedTransaction<'_, C>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    /// The transaction's connection, for the message's effects.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo(mut claimed: inbox_runtime::ClaimedTransaction<'_, diesel_async::AsyncPgConnection>) {
    /// let _conn: &mut diesel_async::AsyncPgConnection = claimed.conn();
    /// # }
    /// ```
    pub fn conn(&mut self) -> &mut C {
        self.exec.conn()
    }

    /// Ends the transaction by the body's result: commits the claim and the
    /// effects on `Ok`, rolls both back on `Err` and returns the body's
    /// error. A commit or rollback that fails is reported instead (see
    /// [`InboxError`]: an ignored failed statement, a transaction the
    /// database had already rolled back), carried in a Diesel error that
    /// [`InboxError::find_in`](crate::InboxError::find_in) recovers.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo(claimed: inbox_runtime::ClaimedTransaction<'_, diesel_async::AsyncPgConnection>) -> diesel::QueryResult<()> {
    /// claimed.finish(Ok::<(), diesel::result::Error>(())).await
    /// # }
    /// ```
    pub async fn finish<R, E>(mut self, result: Result<R, E>) -> Result<R, E>
    where
        E: From<diesel::result::Error> + std::error::Error + 'static,
    {
        self.claimed.finish(&mut self.exec, result).await
    }

    /// Ends the transaction after the body ran (under `catch_unwind`),
    /// storing the result first when `P` says so (see the delivery core's
    /// `Claimed::finish_replying`).
    pub(crate) async fn finish_replying<P, R, E>(
        mut self,
        ran: BodyRan<Result<R, E>>,
    ) -> Result<R, E>
    where
        P: Reply<R>,
        E: HandlerError,
    {
        let result = self.claimed.ran(ran);
        self.claimed
            .finish_replying::<P, R, E, _>(&mut self.exec, result)
            .await
    }

    /// Ends the transaction by the body's result (under `catch_unwind`): a
    /// panic rolls back, then resumes.
    pub(crate) async fn finish_or_resume<R, E>(mut self, ran: BodyRan<Result<R, E>>) -> Result<R, E>
    where
        E: HandlerError,
    {
        let result = self.claimed.ran(ran);
        self.claimed.finish_or_resume(&mut self.exec, result).await
    }

    /// What the body runs in ([`run_body`](super::single::run_body)): the
    /// delivery's span (feature `tracing`), and what collects the
    /// statements it leaves for the commit.
    pub(crate) fn body_start(&self) -> BodyStart {
        self.claimed.body_start()
    }
}

/// A diesel-async connection as the delivery core's [`Executor`], guarded
/// so that a future dropped inside a level marks it broken.
///
/// Where the backend writes its begin and claim as one text
/// ([`InboxBackend::push_begin_and_claim`]: MySQL/MariaDB, whose prepared
/// claim costs a round trip of its own while diesel-async sends a text of
/// several statements in one), the outermost begin is held for the claim
/// and sent with it: a processed message then costs the begin and claim,
/// the body's statements, the commit; a duplicate the begin and claim, and
/// the commit. The text stops at its first failing statement, so a claim
/// never runs after a begin that failed (it would commit on its own, the
/// connection's `autocommit` on), and a begin that ran is rolled back with
/// the level when its claim failed.
pub(crate) struct Async<'c, C: AsyncConnection> {
    guard: OpenTransactionGuard<'c, C>,
    /// The outermost begin not sent yet, held for the claim.
    held: Option<HeldBegin>,
}

impl<'c, C: AsyncConnection> Async<'c, C> {
    /// Executes on `conn`.
    pub(crate) fn new(conn: &'c mut C) -> Self {
        Async {
            guard: OpenTransactionGuard::new(conn),
            held: None,
        }
    }
}

/// Sends `held`, an outermost begin no claim took, before a statement of
/// another kind (the delivery core sends none between the begin and the
/// claim, but a fingerprinted claim goes as a statement of its own).
async fn flush<C: AsyncConnection>(conn: &mut C, held: Option<HeldBegin>) -> QueryResult<()> {
    match held {
        Some(begin) => conn.batch_execute(&begin.sql()).await,
        None => Ok(()),
    }
}

/// The text of `held` and the claim of `key` ([`InboxBackend::push_begin_and_claim`]),
/// where the backend writes one for that key.
fn begin_and_claim<DB: InboxBackend>(
    held: HeldBegin,
    key: &ClaimKey,
    bound: Option<ClaimBound>,
) -> Option<String> {
    let mut text = String::new();
    DB::push_begin_and_claim(&mut text, held.idle_seconds(), key, bound).then_some(text)
}

/// The affected rows of a claim sent in one text with its begin
/// ([`InboxBackend::push_begin_and_claim`]): its success inserted the row,
/// and a unique violation (the only one its text can raise) is a duplicate.
fn claimed_by_text(sent: QueryResult<()>) -> QueryResult<usize> {
    use diesel::result::{DatabaseErrorKind, Error};
    match sent {
        Ok(()) => Ok(1),
        Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(0),
        Err(error) => Err(error),
    }
}

impl<C> Executor for Async<'_, C>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    type Backend = C::Backend;
    type Conn = C;

    /// The connection, for a body: never with a begin held (it would run
    /// in autocommit), since a held begin goes with the claim or before any
    /// other statement.
    fn conn(&mut self) -> &mut C {
        debug_assert!(self.held.is_none(), "a begin held past its claim");
        self.guard.conn()
    }

    fn status(&mut self) -> &mut TransactionManagerStatus {
        C::TransactionManager::transaction_manager_status_mut(self.guard.conn())
    }

    fn idle_limit(&self) -> Option<Duration> {
        abandoned_transaction_timeout()
    }

    fn set_open(&mut self, open: bool) {
        self.guard.set_open(open);
    }

    /// diesel-async sends a text of several statements in one round trip.
    fn pays_per_statement(&self, _scope: &Scope) -> bool {
        false
    }

    fn level_sql(
        &mut self,
        _scope: &Scope,
        sql: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let held = self.held.take();
        let conn = self.guard.conn();
        async move {
            flush(&mut *conn, held).await?;
            conn.batch_execute(sql).await
        }
    }

    /// Holds an outermost begin for a claim the backend writes as a text
    /// (see [`Async`]). A savepoint it does not take: the caller's
    /// transaction is open already, and the savepoint goes at once.
    fn hold_begin(&mut self, scope: &Scope) -> bool {
        if !C::Backend::CLAIMS_AS_TEXT || self.held.is_some() {
            return false;
        }
        self.held = scope.held_begin();
        self.held.is_some()
    }

    fn claim(
        &mut self,
        key: &ClaimKey,
        bound: Option<ClaimBound>,
        token: bool,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        use diesel_async::RunQueryDsl;
        let held = self.held.take();
        let with_claim = held.and_then(|held| begin_and_claim::<C::Backend>(held, key, bound));
        let held = held.filter(|_| with_claim.is_none());
        let conn = self.guard.conn();
        async move {
            if let Some(text) = with_claim {
                return claimed_by_text(conn.batch_execute(&text).await);
            }
            flush(&mut *conn, held).await?;
            if token {
                let statement = TokenClaimStatement { key, bound };
                return by_shape!(C::Backend, statement, |claim| claim.execute(conn).await);
            }
            match (bound, key.fingerprint()) {
                (Some(bound), _) => {
                    by_shape!(C::Backend, BoundedClaimStatement { key, bound }, |claim| {
                        claim.execute(conn).await
                    })
                }
                (None, None) => ClaimStatement::new(key).execute(conn).await,
                (None, Some(fingerprint)) => {
                    FingerprintedClaimStatement { key, fingerprint }
                        .execute(conn)
                        .await
                }
            }
        }
    }

    fn commit_claim_checked(
        &mut self,
        key: &ClaimKey,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        use diesel_async::RunQueryDsl;
        let held = self.held.take();
        let conn = self.guard.conn();
        async move {
            flush(&mut *conn, held).await?;
            ClaimCheckStatement { key }.execute(conn).await.map(drop)
        }
    }

    fn claim_reading(
        &mut self,
        key: &ClaimKey,
        bound: Option<ClaimBound>,
    ) -> impl Future<Output = QueryResult<Vec<ReadingClaimRow>>> + Send {
        let held = self.held.take();
        let conn = self.guard.conn();
        async move {
            flush(&mut *conn, held).await?;
            C::Backend::load_reading_claim_async(conn, key, bound).await
        }
    }

    fn execute_bound(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let held = self.held.take();
        let conn = self.guard.conn();
        async move {
            flush(&mut *conn, held).await?;
            C::Backend::execute_cached_async(conn, sql, binds).await
        }
    }

    fn load_stored_claim(
        &mut self,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = QueryResult<Vec<StoredClaimRow>>> + Send {
        let held = self.held.take();
        let conn = self.guard.conn();
        async move {
            flush(&mut *conn, held).await?;
            C::Backend::load_stored_claim_async(conn, sql, binds).await
        }
    }

    fn load_flag(&mut self, sql: &'static str) -> impl Future<Output = QueryResult<bool>> + Send {
        let held = self.held.take();
        let conn = self.guard.conn();
        async move {
            flush(&mut *conn, held).await?;
            C::Backend::load_flag_async(conn, sql).await
        }
    }

    fn claim_batch(
        &mut self,
        handler: &str,
        ids: &[&str],
        bound: Option<&ClaimBound>,
    ) -> impl Future<Output = QueryResult<BatchClaimed>> + Send {
        let held = self.held.take();
        let conn = self.guard.conn();
        async move {
            flush(&mut *conn, held).await?;
            C::Backend::claim_batch_async(conn, handler, ids, bound).await
        }
    }
}
