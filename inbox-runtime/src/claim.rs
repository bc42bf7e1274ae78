//! Claiming a message id: the one statement that makes a delivery the first.

use diesel::connection::{Connection, TransactionManager};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::{QueryResult, RunQueryDsl};

use crate::backend::InboxBackend;
use crate::error::InboxError;
use crate::execution::require_transaction;
use crate::key::ClaimKey;
use crate::recovery::is_refused_key_text;

/// Whether a claim made this delivery the first one for its key.
///
/// ```
/// assert_ne!(inbox_runtime::Claim::Claimed, inbox_runtime::Claim::Duplicate);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a duplicate claim means the message's effects must not be applied again"]
pub enum Claim {
    /// The id was not in the inbox: this transaction now holds it and must
    /// apply the message's effects.
    Claimed,
    /// The id is already in the inbox (committed by an earlier delivery):
    /// apply nothing.
    Duplicate,
}

/// Claims `key` inside the transaction open on `conn`.
///
/// The row becomes durable only when the caller's transaction commits, together
/// with the effects written through the same connection; if the transaction
/// rolls back, the id is free again and a redelivery is processed. A delivery
/// of the same key racing on another connection waits for this transaction to
/// finish.
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
    C: Connection,
    C::Backend: InboxBackend,
{
    claim_statement(conn, key).map_err(|error| refused_or_database(key, error).into())
}

/// Runs the claim statement inside the transaction open on `conn`.
pub(crate) fn claim_statement<C>(conn: &mut C, key: &ClaimKey) -> QueryResult<Claim>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    require_transaction(C::TransactionManager::transaction_manager_status_mut(conn))?;
    let affected = ClaimStatement::new(key).execute(conn)?;
    Ok(claim_from_affected_rows(affected))
}

/// What a failed claim statement means: the database refused the key's text
/// (an invalid message, never retried), or a database failure.
pub(crate) fn refused_or_database(key: &ClaimKey, error: diesel::result::Error) -> InboxError {
    if is_refused_key_text(&error) {
        key.refused_by_database()
    } else {
        InboxError::Database(error)
    }
}

/// Reads the claim statement's affected-row count: one row inserted means the
/// key is new; zero means it was already there.
pub(crate) fn claim_from_affected_rows(affected: usize) -> Claim {
    match affected {
        0 => Claim::Duplicate,
        _ => Claim::Claimed,
    }
}

/// The claim as a Diesel query: the same statement serves blocking and async
/// connections, and reports one affected row for a new key, zero for a
/// duplicate.
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use inbox_runtime::{ClaimKey, ClaimStatement, HandlerName};
/// let key = ClaimKey::new(HandlerName::new("h")?, "m")?;
/// let sql = diesel::debug_query::<diesel::pg::Pg, _>(&ClaimStatement::new(&key)).to_string();
/// assert!(sql.starts_with("INSERT INTO inbox_messages (handler, message_id) VALUES ($1, $2) ON CONFLICT"));
/// # }
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ClaimStatement<'k> {
    key: &'k ClaimKey,
}

impl<'k> ClaimStatement<'k> {
    /// The claim statement for `key`.
    ///
    /// ```
    /// # use inbox_runtime::{ClaimKey, ClaimStatement, HandlerName};
    /// let key = ClaimKey::new(HandlerName::new("h")?, "m")?;
    /// let _statement = ClaimStatement::new(&key);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn new(key: &'k ClaimKey) -> Self {
        ClaimStatement { key }
    }
}

/// The statement's text depends only on the backend, so prepared statements
/// are cached under one id.
#[doc(hidden)]
#[derive(Debug)]
pub struct ClaimStatementId;

impl QueryId for ClaimStatement<'_> {
    type QueryId = ClaimStatementId;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<DB: InboxBackend> QueryFragment<DB> for ClaimStatement<'_> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        DB::walk_claim(self.key, out)
    }
}

impl<C> RunQueryDsl<C> for ClaimStatement<'_> {}
