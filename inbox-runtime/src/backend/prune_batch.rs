//! The pruning batch as a Diesel query, and the pieces of SQL every
//! backend's batch is assembled from: each backend file fills a [`Delete`]
//! with its own SQL (see `InboxBackend::walk_prune_batch`).

use std::fmt;
use std::time::Duration;

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use diesel::sql_types::{BigInt, Text};
use diesel::{QueryResult, RunQueryDsl};

use crate::backend::InboxBackend;
use crate::duration::format_duration;
use crate::key::HandlerName;

/// Which handlers' rows a pruning pass covers.
///
/// A [`RetentionPolicy`](crate::RetentionPolicy) with per-handler windows
/// prunes in several passes: each handler with a window of its own
/// ([`PruneScope::Handler`]), then everybody else ([`PruneScope::AllExcept`]).
///
/// ```
/// use inbox_runtime::{HandlerName, prune::PruneScope};
/// let h = HandlerName::new("billing")?;
/// assert_eq!(PruneScope::Handler(&h).to_string(), "handler `billing`");
/// assert_eq!(PruneScope::All.to_string(), "all handlers");
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneScope<'p> {
    /// Every handler's rows.
    All,
    /// One handler's rows.
    Handler(&'p HandlerName),
    /// Every handler's rows except these handlers'.
    AllExcept(&'p [HandlerName]),
}

impl fmt::Display for PruneScope<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PruneScope::All | PruneScope::AllExcept([]) => f.write_str("all handlers"),
            PruneScope::Handler(handler) => write!(f, "handler `{handler}`"),
            PruneScope::AllExcept(handlers) => {
                f.write_str("all handlers except ")?;
                for (i, handler) in handlers.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "`{handler}`")?;
                }
                Ok(())
            }
        }
    }
}

/// The table a pruning batch deletes from.
///
/// ```
/// use inbox_runtime::prune::PrunedTable;
/// assert_eq!(PrunedTable::Claims.to_string(), "inbox_messages");
/// assert_eq!(PrunedTable::Failures.to_string(), "inbox_failures");
/// assert_eq!(PrunedTable::Outbox.to_string(), "inbox_outbox");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrunedTable {
    /// `inbox_messages`: the claims, by `received_at`.
    Claims,
    /// `inbox_failures`: failed attempts and dead messages, by
    /// `last_failed_at` (a dead message's claim and its failure record
    /// expire together: both are written when it dies).
    Failures,
    /// `inbox_outbox`: outgoing messages the broker confirmed, by
    /// `sent_at` (pending and dead ones are never pruned).
    Outbox,
}

impl PrunedTable {
    /// The table's name.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::prune::PrunedTable::Claims.name(), "inbox_messages");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            PrunedTable::Claims => "inbox_messages",
            PrunedTable::Failures => "inbox_failures",
            PrunedTable::Outbox => "inbox_outbox",
        }
    }
}

impl fmt::Display for PrunedTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One pruning batch: deletes at most `limit` rows of a scope whose
/// `received_at` is older than `keep` by the database clock, skipping rows
/// locked by other transactions. Its affected-row count is the number of rows
/// deleted; a count below the limit means the scope is caught up.
///
/// Like [`ClaimStatement`](crate::ClaimStatement), it is a Diesel query, so
/// blocking and async connections run the same SQL:
///
/// | backend | batch |
/// |---|---|
/// | PostgreSQL | `DELETE … WHERE ctid = ANY(ARRAY(SELECT ctid … ORDER BY received_at LIMIT $n FOR UPDATE SKIP LOCKED))` |
/// | MySQL / MariaDB | `DELETE … FROM (SELECT … FORCE INDEX (…) … ORDER BY received_at LIMIT ? FOR UPDATE SKIP LOCKED) AS expired STRAIGHT_JOIN inbox_messages …` |
/// | SQLite | `DELETE … WHERE (handler, message_id) IN (SELECT … ORDER BY received_at LIMIT ?)` |
///
/// A batch over every handler walks the `received_at` index; a batch over
/// one handler walks `(handler, received_at)` (forced: an index hint on
/// MySQL and SQLite, on PostgreSQL a comparison only that index serves):
/// either way it reads the scope's expired rows oldest first and stops at
/// its limit. A batch over [`PruneScope::AllExcept`]
/// walks `received_at` and passes over the excluded handlers' rows, reading
/// them (on MySQL, locking them): [`Prune::run`](crate::Prune::run) does not
/// run it, but walks the handlers one by one instead (see
/// [`Prune::statements`](crate::Prune::statements)).
///
/// Run each one in a transaction of its own at `READ COMMITTED` (what
/// [`Prune::run`](crate::Prune::run) does), repeating it until it deletes
/// fewer rows than its limit.
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use inbox_runtime::{Prune, RetentionPolicy};
///
/// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?).batch_size(1000);
/// let statements = prune.statements();
/// let sql = diesel::debug_query::<diesel::pg::Pg, _>(&statements[0]).to_string();
/// assert!(sql.starts_with("DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(SELECT ctid"));
/// assert!(sql.contains("FOR UPDATE SKIP LOCKED"));
/// # }
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PruneBatchStatement<'p> {
    table: PrunedTable,
    scope: PruneScope<'p>,
    keep: Duration,
    /// `keep` as bound into the SQL (read by the backends' writers).
    #[cfg_attr(
        not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
        allow(dead_code)
    )]
    keep_micros: i64,
    limit: i64,
}

impl<'p> PruneBatchStatement<'p> {
    /// Only [`Prune`](crate::Prune) builds statements, from a validated policy.
    pub(crate) fn new(
        table: PrunedTable,
        scope: PruneScope<'p>,
        keep: Duration,
        limit: u32,
    ) -> Self {
        PruneBatchStatement {
            table,
            scope,
            keep,
            // The policy caps windows at MAX_RETENTION, far below i64::MAX µs.
            keep_micros: i64::try_from(keep.as_micros()).unwrap_or(i64::MAX),
            limit: i64::from(limit),
        }
    }

    /// This batch's window and limit, for `scope` instead (a handler of an
    /// `AllExcept` pass).
    pub(crate) fn with_scope<'q>(&self, scope: PruneScope<'q>) -> PruneBatchStatement<'q> {
        PruneBatchStatement {
            table: self.table,
            scope,
            keep: self.keep,
            keep_micros: self.keep_micros,
            limit: self.limit,
        }
    }

    /// The table this batch deletes from.
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy, prune::PrunedTable};
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?);
    /// let statements = prune.statements();
    /// assert_eq!(statements[0].table(), PrunedTable::Claims);
    /// assert_eq!(statements[1].table(), PrunedTable::Failures);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn table(&self) -> PrunedTable {
        self.table
    }

    /// The handlers this batch covers.
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy, prune::PruneScope};
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?);
    /// assert_eq!(prune.statements()[0].scope(), PruneScope::All);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn scope(&self) -> PruneScope<'p> {
        self.scope
    }

    /// The retention window: rows older than this are deleted.
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy};
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?);
    /// assert_eq!(prune.statements()[0].keep().as_secs(), 7 * 86_400);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn keep(&self) -> Duration {
        self.keep
    }

    /// The most rows one execution deletes.
    ///
    /// ```
    /// # use inbox_runtime::{Prune, RetentionPolicy};
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?).batch_size(250);
    /// assert_eq!(prune.statements()[0].limit(), 250);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn limit(&self) -> u64 {
        self.limit.unsigned_abs()
    }

    /// The one handler the batch covers, if it covers one only.
    pub(crate) fn single_handler(&self) -> Option<&'p str> {
        match self.scope {
            PruneScope::Handler(handler) => Some(handler.as_str()),
            PruneScope::All | PruneScope::AllExcept(_) => None,
        }
    }
}

impl fmt::Display for PruneBatchStatement<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {}, older than {}, {} rows at a time",
            self.table,
            self.scope,
            format_duration(self.keep),
            self.limit
        )
    }
}

/// The SQL differs with the number of excluded handlers, so statements are
/// cached by their text rather than under one static id.
impl QueryId for PruneBatchStatement<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<DB: InboxBackend> QueryFragment<DB> for PruneBatchStatement<'_> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        DB::walk_prune_batch(self, out)
    }
}

impl<C> RunQueryDsl<C> for PruneBatchStatement<'_> {}

/// ` AND handler = ?` or ` AND handler NOT IN (?, …)`.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn push_scope<'b, DB>(scope: &PruneScope<'b>, out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()>
where
    DB: Backend + diesel::sql_types::HasSqlType<Text>,
    str: diesel::serialize::ToSql<Text, DB>,
{
    match *scope {
        PruneScope::All | PruneScope::AllExcept([]) => {}
        PruneScope::Handler(handler) => {
            out.push_sql(" AND handler = ");
            out.push_bind_param::<Text, str>(handler.as_str())?;
        }
        PruneScope::AllExcept(handlers) => {
            out.push_sql(" AND handler NOT IN (");
            for (i, handler) in handlers.iter().enumerate() {
                if i > 0 {
                    out.push_sql(", ");
                }
                out.push_bind_param::<Text, str>(handler.as_str())?;
            }
            out.push_sql(")");
        }
    }
    Ok(())
}

/// A backend's batch: `{head}{select} WHERE {key} < {cutoff} [scope]
/// ORDER BY {key} LIMIT {limit}{lock}{tail}`, which deletes the oldest
/// expired rows of the scope. The cutoff is the database clock minus the
/// window, bound in microseconds between `cutoff.0` and `cutoff.1`. A batch
/// over one handler picks with `one_handler`, any other with `all`.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) struct Delete {
    pub(crate) head: &'static str,
    pub(crate) one_handler: Pick,
    pub(crate) all: Pick,
    pub(crate) lock: &'static str,
    pub(crate) tail: &'static str,
}

/// How a batch picks its rows: which index it walks.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) struct Pick {
    /// `SELECT … FROM inbox_messages`, with an index hint where the backend
    /// has them.
    pub(crate) select: &'static str,
    /// `received_at` as the walked index has it.
    pub(crate) key: &'static str,
    /// The SQL before and after the bound window (in microseconds).
    pub(crate) cutoff: (&'static str, &'static str),
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
impl Delete {
    /// Writes `batch` with this backend's SQL.
    pub(crate) fn walk<'b, DB>(
        &self,
        batch: &'b PruneBatchStatement<'_>,
        mut out: AstPass<'_, 'b, DB>,
    ) -> QueryResult<()>
    where
        DB: Backend + diesel::sql_types::HasSqlType<Text> + diesel::sql_types::HasSqlType<BigInt>,
        str: diesel::serialize::ToSql<Text, DB>,
        i64: diesel::serialize::ToSql<BigInt, DB>,
    {
        let pick = match batch.scope {
            PruneScope::Handler(_) => &self.one_handler,
            PruneScope::All | PruneScope::AllExcept(_) => &self.all,
        };
        out.push_sql(self.head);
        out.push_sql(pick.select);
        out.push_sql(" WHERE ");
        out.push_sql(pick.key);
        out.push_sql(" < ");
        out.push_sql(pick.cutoff.0);
        out.push_bind_param::<BigInt, i64>(&batch.keep_micros)?;
        out.push_sql(pick.cutoff.1);
        push_scope(&batch.scope, &mut out)?;
        out.push_sql(" ORDER BY ");
        out.push_sql(pick.key);
        out.push_sql(" LIMIT ");
        out.push_bind_param::<BigInt, i64>(&batch.limit)?;
        out.push_sql(self.lock);
        out.push_sql(self.tail);
        Ok(())
    }
}

/// The first handler name after `after` in the inbox (`""`: the first of
/// all), `NULL` past the last: one probe of an index that starts with
/// `handler`, however many rows each handler has. A pass over
/// [`PruneScope::AllExcept`] finds the handlers to prune with it, one at a
/// time, and skips the excluded ones without reading their rows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NextHandler<'a> {
    pub(crate) after: &'a str,
}

impl QueryId for NextHandler<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl diesel::query_builder::Query for NextHandler<'_> {
    type SqlType = diesel::sql_types::Nullable<diesel::sql_types::Text>;
}

impl<DB> QueryFragment<DB> for NextHandler<'_>
where
    DB: diesel::backend::Backend + diesel::sql_types::HasSqlType<diesel::sql_types::Text>,
    str: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("SELECT MIN(handler) FROM inbox_messages WHERE handler > ");
        out.push_bind_param::<diesel::sql_types::Text, str>(self.after)?;
        Ok(())
    }
}

impl<C> RunQueryDsl<C> for NextHandler<'_> {}

/// [`NextHandler`] on a blocking connection (for `InboxBackend`'s
/// implementations, where the backend is known).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn next_handler<'a, C>(conn: &mut C, after: &'a str) -> QueryResult<Option<String>>
where
    C: diesel::connection::LoadConnection,
    NextHandler<'a>: diesel::query_dsl::LoadQuery<'a, C, Option<String>>,
{
    NextHandler { after }.get_result(conn)
}

/// [`NextHandler`] on a diesel-async connection.
#[cfg(all(
    feature = "async",
    any(feature = "postgres", feature = "sqlite", feature = "mysql")
))]
// Not an `async fn`: the future must be declared `Send` (the tokio pruner
// task needs it), which an `async fn` leaves to inference that fails for a
// generic connection.
#[allow(clippy::manual_async_fn)]
pub(crate) fn next_handler_async<'c, C>(
    conn: &'c mut C,
    after: &'c str,
) -> impl std::future::Future<Output = QueryResult<Option<String>>> + Send + 'c
where
    C: diesel_async::AsyncConnection,
    NextHandler<'c>: diesel_async::methods::LoadQuery<'c, C, Option<String>> + 'c,
{
    async move { diesel_async::RunQueryDsl::get_result(NextHandler { after }, conn).await }
}

/// The SQL and binds of one pruning batch as `DB` writes it (`debug_query`),
/// for the backends' tests of their statement.
#[cfg(test)]
pub(crate) fn batch_sql<DB>(scope: PruneScope<'_>, keep: Duration, limit: u32) -> String
where
    DB: InboxBackend + Default,
    DB::QueryBuilder: Default,
{
    table_batch_sql::<DB>(PrunedTable::Claims, scope, keep, limit)
}

/// [`batch_sql`] for a batch over `table`.
#[cfg(test)]
pub(crate) fn table_batch_sql<DB>(
    table: PrunedTable,
    scope: PruneScope<'_>,
    keep: Duration,
    limit: u32,
) -> String
where
    DB: InboxBackend + Default,
    DB::QueryBuilder: Default,
{
    diesel::debug_query::<DB, _>(&PruneBatchStatement::new(table, scope, keep, limit)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_display() {
        let a = HandlerName::new("a").unwrap();
        let list = [a.clone(), HandlerName::new("b").unwrap()];
        assert_eq!(
            PruneScope::AllExcept(&list).to_string(),
            "all handlers except `a`, `b`"
        );
        assert_eq!(PruneScope::AllExcept(&[]).to_string(), "all handlers");
        let statement = PruneBatchStatement::new(
            PrunedTable::Failures,
            PruneScope::Handler(&a),
            Duration::from_secs(7200),
            10,
        );
        assert_eq!(
            statement.to_string(),
            "inbox_failures of handler `a`, older than 2h, 10 rows at a time"
        );
    }
}
