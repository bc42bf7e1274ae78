//! Idempotent handlers on `diesel-async` (feature `async`).
//!
//! The same claim statement, schema and semantics as the blocking API, for
//! [`AsyncPgConnection`](diesel_async::AsyncPgConnection) and
//! [`AsyncMysqlConnection`](diesel_async::AsyncMysqlConnection), directly or
//! from a deadpool or bb8 pool.

use diesel::QueryResult;
use diesel_async::{AsyncConnection, TransactionManager};
use futures_util::FutureExt;
use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

use crate::backend::InboxBackend;
use crate::claim::{
    claim_from_affected_rows, ensure_in_transaction, retry_claim, Claim, ClaimStatement,
};
use crate::error::HandlerError;
use crate::key::ClaimKey;
use crate::outcome::OnDuplicate;

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
    ensure_in_transaction(C::TransactionManager::transaction_manager_status_mut(conn))?;
    let affected = diesel_async::RunQueryDsl::execute(ClaimStatement::new(key), conn).await?;
    Ok(claim_from_affected_rows(affected))
}

/// Runs the async `body` inside one transaction that first claims `key`; the
/// async twin of [`run_idempotent`](crate::run_idempotent), with the same
/// semantics (duplicates skip the body, `Err` and panics roll back, nested
/// calls become savepoints, a claim that loses a lock conflict is retried).
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
/// A connection you hold yourself must be dropped after a cancellation: until
/// it is, the server keeps the abandoned transaction (and the row lock on the
/// claimed id, which makes a concurrent delivery of the same id wait).
pub async fn run_idempotent_async<C, R, E, F>(conn: &mut C, key: ClaimKey, body: F) -> Result<R, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    R: OnDuplicate,
    E: HandlerError,
    F: AsyncFnOnce(&mut C) -> Result<R, E>,
{
    let Some(mut claimed) = begin_claimed(conn, &key).await? else {
        return Ok(R::on_duplicate());
    };
    let result = AssertUnwindSafe(body(claimed.conn())).catch_unwind().await;
    claimed.finish_or_resume(result).await
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
    let outermost = C::TransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()?
        .is_none();
    let mut transaction = ClaimedTransaction { conn, open: false };
    let mut attempt = 1;
    loop {
        transaction.begin().await?;
        match claim_async(transaction.conn, key).await {
            Ok(Claim::Claimed) => return Ok(Some(transaction)),
            Ok(Claim::Duplicate) => {
                transaction.commit().await?;
                return Ok(None);
            }
            Err(error) if outermost && retry_claim(&error, attempt) => {
                transaction.roll_back().await?;
                attempt += 1;
            }
            Err(error) => return Err(transaction.roll_back_reporting(error).await),
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
    conn: &'c mut C,
    open: bool,
}

impl<C: AsyncConnection> ClaimedTransaction<'_, C> {
    /// The transaction's connection, for the message's effects.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo(mut claimed: inbox_runtime::ClaimedTransaction<'_, diesel_async::AsyncPgConnection>) {
    /// let _conn: &mut diesel_async::AsyncPgConnection = claimed.conn();
    /// # }
    /// ```
    pub fn conn(&mut self) -> &mut C {
        self.conn
    }

    /// Ends the transaction by the body's result: commits the claim and the
    /// effects on `Ok`, rolls both back on `Err` (reporting the body's error,
    /// unless the rollback itself failed for another reason than an already
    /// broken connection: the rule of Diesel's own `transaction`).
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")]
    /// # async fn demo(claimed: inbox_runtime::ClaimedTransaction<'_, diesel_async::AsyncPgConnection>) -> diesel::QueryResult<()> {
    /// claimed.finish(Ok::<(), diesel::result::Error>(())).await
    /// # }
    /// ```
    pub async fn finish<R, E>(mut self, result: Result<R, E>) -> Result<R, E>
    where
        E: From<diesel::result::Error>,
    {
        match result {
            Ok(value) => {
                self.commit().await?;
                Ok(value)
            }
            Err(error) => match self.roll_back().await {
                Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => Err(error),
                Err(rollback_error) => Err(E::from(rollback_error)),
            },
        }
    }

    /// [`finish`](Self::finish) for a body run under `catch_unwind`: a panic
    /// rolls back, then resumes.
    pub(crate) async fn finish_or_resume<R, E>(
        mut self,
        result: Result<Result<R, E>, Box<dyn Any + Send>>,
    ) -> Result<R, E>
    where
        E: From<diesel::result::Error>,
    {
        match result {
            Ok(result) => self.finish(result).await,
            Err(panic) => {
                // The panic matters more than a failed rollback; a failed
                // rollback leaves the connection marked broken anyway.
                let _ = self.roll_back().await;
                panic::resume_unwind(panic)
            }
        }
    }

    /// Sends `BEGIN` (or a savepoint). Marked open first, so a cancellation
    /// while it is in flight also marks the connection broken.
    async fn begin(&mut self) -> QueryResult<()> {
        self.open = true;
        let result = C::TransactionManager::begin_transaction(self.conn).await;
        self.open = result.is_ok();
        result
    }

    async fn commit(&mut self) -> QueryResult<()> {
        let result = C::TransactionManager::commit_transaction(self.conn).await;
        self.open = false;
        result
    }

    async fn roll_back(&mut self) -> QueryResult<()> {
        let result = C::TransactionManager::rollback_transaction(self.conn).await;
        self.open = false;
        result
    }

    /// Rolls back after `error` and says which error to report.
    async fn roll_back_reporting(&mut self, error: diesel::result::Error) -> diesel::result::Error {
        match self.roll_back().await {
            Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => error,
            Err(rollback_error) => rollback_error,
        }
    }
}

impl<C: AsyncConnection> Drop for ClaimedTransaction<'_, C> {
    fn drop(&mut self) {
        if self.open {
            C::TransactionManager::transaction_manager_status_mut(self.conn).set_in_error();
        }
    }
}
