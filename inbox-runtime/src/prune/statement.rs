//! One pruning batch as a Diesel query, written once per backend.

use std::fmt;
use std::time::Duration;

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use diesel::sql_types::{BigInt, Text};
use diesel::{QueryResult, RunQueryDsl};

use crate::backend::InboxBackend;
use crate::key::HandlerName;
use crate::retention::format_duration;

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
/// | MySQL / MariaDB | `DELETE … FROM (SELECT … FORCE INDEX (inbox_messages_received_at_idx) … ORDER BY received_at LIMIT ? FOR UPDATE SKIP LOCKED) AS expired STRAIGHT_JOIN inbox_messages …` |
/// | SQLite | `DELETE … WHERE (handler, message_id) IN (SELECT … ORDER BY received_at LIMIT ?)` |
///
/// Run each one in a transaction of its own at `READ COMMITTED` (what
/// [`Prune::run`](crate::Prune::run) does), repeating it until it deletes
/// fewer rows than its limit.
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use inbox_runtime::{Prune, RetentionPolicy};
///
/// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?).batch_size(1000)?;
/// let statements = prune.statements();
/// let sql = diesel::debug_query::<diesel::pg::Pg, _>(&statements[0]).to_string();
/// assert!(sql.starts_with("DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(SELECT ctid"));
/// assert!(sql.contains("FOR UPDATE SKIP LOCKED"));
/// # }
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PruneBatchStatement<'p> {
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
    pub(crate) fn new(scope: PruneScope<'p>, keep: Duration, limit: u32) -> Self {
        PruneBatchStatement {
            scope,
            keep,
            // The policy caps windows at MAX_RETENTION, far below i64::MAX µs.
            keep_micros: i64::try_from(keep.as_micros()).unwrap_or(i64::MAX),
            limit: i64::from(limit),
        }
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
    /// let prune = Prune::new(RetentionPolicy::parse("7d", "1d")?).batch_size(250)?;
    /// assert_eq!(prune.statements()[0].limit(), 250);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn limit(&self) -> u64 {
        self.limit.unsigned_abs()
    }
}

impl fmt::Display for PruneBatchStatement<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, older than {}, {} rows at a time",
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

/// A backend's batch: `{head}{select} WHERE received_at < {cutoff} [scope]
/// ORDER BY received_at LIMIT {limit}{lock}{tail}`, which deletes the oldest
/// expired rows of the scope. The cutoff is the database clock minus the
/// window, bound in microseconds between `cutoff.0` and `cutoff.1`.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
struct Delete {
    head: &'static str,
    select: &'static str,
    cutoff: (&'static str, &'static str),
    lock: &'static str,
    tail: &'static str,
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
impl Delete {
    fn walk<'b, DB>(
        &self,
        batch: &'b PruneBatchStatement<'_>,
        mut out: AstPass<'_, 'b, DB>,
    ) -> QueryResult<()>
    where
        DB: Backend + diesel::sql_types::HasSqlType<Text> + diesel::sql_types::HasSqlType<BigInt>,
        str: diesel::serialize::ToSql<Text, DB>,
        i64: diesel::serialize::ToSql<BigInt, DB>,
    {
        out.push_sql(self.head);
        out.push_sql(self.select);
        out.push_sql(" WHERE received_at < ");
        out.push_sql(self.cutoff.0);
        out.push_bind_param::<BigInt, i64>(&batch.keep_micros)?;
        out.push_sql(self.cutoff.1);
        push_scope(&batch.scope, &mut out)?;
        out.push_sql(" ORDER BY received_at LIMIT ");
        out.push_bind_param::<BigInt, i64>(&batch.limit)?;
        out.push_sql(self.lock);
        out.push_sql(self.tail);
        Ok(())
    }
}

/// PostgreSQL: pick and lock the oldest expired rows, skipping rows another
/// transaction holds (a live handler, a second pruner), then delete them by
/// their physical address: a TID scan, no second index lookup.
#[cfg(feature = "postgres")]
pub(crate) fn walk_postgres<'b>(
    batch: &'b PruneBatchStatement<'_>,
    out: AstPass<'_, 'b, diesel::pg::Pg>,
) -> QueryResult<()> {
    Delete {
        head: "DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(",
        select: "SELECT ctid FROM inbox_messages",
        cutoff: ("now() - ", " * INTERVAL '1 microsecond'"),
        lock: " FOR UPDATE SKIP LOCKED",
        tail: "))",
    }
    .walk(batch, out)
}

/// MySQL / MariaDB: the expired keys are picked in a derived table (which
/// MySQL materializes because of its `LIMIT`) with `SKIP LOCKED`, then joined
/// to the table by primary key. `STRAIGHT_JOIN` keeps that order: the other
/// order scans the whole table and waits on every row a live handler holds.
///
/// The pick walks the `received_at` index, oldest first, and stops after
/// `limit` rows. Left to itself, the optimizer reads a one-handler scope
/// through the primary key (`handler = ?`) and sorts: that reads every row
/// of the handler and locks every expired one, in every batch. So the index
/// is forced.
#[cfg(feature = "mysql")]
pub(crate) fn walk_mysql<'b>(
    batch: &'b PruneBatchStatement<'_>,
    out: AstPass<'_, 'b, diesel::mysql::Mysql>,
) -> QueryResult<()> {
    Delete {
        head: "DELETE inbox_messages FROM (",
        select: "SELECT handler, message_id FROM inbox_messages \
                 FORCE INDEX (inbox_messages_received_at_idx)",
        cutoff: ("UTC_TIMESTAMP(6) - INTERVAL ", " MICROSECOND"),
        lock: " FOR UPDATE SKIP LOCKED",
        tail: ") AS expired STRAIGHT_JOIN inbox_messages \
               ON inbox_messages.handler = expired.handler AND inbox_messages.message_id = expired.message_id",
    }
    .walk(batch, out)
}

/// SQLite: one writer at a time, so no row locks to skip; the table has no
/// rowid, so rows are picked by primary key. The cutoff is formatted like the
/// column (`YYYY-MM-DD HH:MM:SS.SSS`, UTC) so text comparison orders by time.
#[cfg(feature = "sqlite")]
pub(crate) fn walk_sqlite<'b>(
    batch: &'b PruneBatchStatement<'_>,
    out: AstPass<'_, 'b, diesel::sqlite::Sqlite>,
) -> QueryResult<()> {
    Delete {
        head: "DELETE FROM inbox_messages WHERE (handler, message_id) IN (",
        select: "SELECT handler, message_id FROM inbox_messages",
        cutoff: (
            "strftime('%Y-%m-%d %H:%M:%f', 'now', printf('-%.6f seconds', ",
            " / 1000000.0))",
        ),
        lock: "",
        tail: ")",
    }
    .walk(batch, out)
}

/// Isolation for a batch's transaction, per backend (see `InboxBackend`).
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_BEFORE_BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";
#[cfg(feature = "postgres")]
pub(crate) const POSTGRES_AFTER_BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

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
        let statement =
            PruneBatchStatement::new(PruneScope::Handler(&a), Duration::from_secs(7200), 10);
        assert_eq!(
            statement.to_string(),
            "handler `a`, older than 2h, 10 rows at a time"
        );
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_sql() {
        let list = [
            HandlerName::new("a").unwrap(),
            HandlerName::new("b").unwrap(),
        ];
        let statement =
            PruneBatchStatement::new(PruneScope::AllExcept(&list), Duration::from_secs(1), 10);
        let sql = diesel::debug_query::<diesel::pg::Pg, _>(&statement).to_string();
        assert_eq!(
            sql,
            "DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(SELECT ctid FROM inbox_messages \
             WHERE received_at < now() - $1 * INTERVAL '1 microsecond' AND handler NOT IN ($2, $3) \
             ORDER BY received_at LIMIT $4 FOR UPDATE SKIP LOCKED)) -- binds: [1000000, \"a\", \"b\", 10]"
        );
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_sql() {
        let a = HandlerName::new("a").unwrap();
        let statement =
            PruneBatchStatement::new(PruneScope::Handler(&a), Duration::from_millis(1), 5);
        let sql = diesel::debug_query::<diesel::mysql::Mysql, _>(&statement).to_string();
        assert!(sql.starts_with("DELETE inbox_messages FROM (SELECT handler, message_id FROM inbox_messages FORCE INDEX (inbox_messages_received_at_idx) WHERE received_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND handler = ? ORDER BY received_at LIMIT ? FOR UPDATE SKIP LOCKED) AS expired STRAIGHT_JOIN"), "{sql}");
        assert!(sql.ends_with("-- binds: [1000, \"a\", 5]"), "{sql}");
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_sql() {
        let statement = PruneBatchStatement::new(PruneScope::All, Duration::from_secs(60), 5);
        let sql = diesel::debug_query::<diesel::sqlite::Sqlite, _>(&statement).to_string();
        assert!(
            sql.contains("(handler, message_id) IN (SELECT handler, message_id"),
            "{sql}"
        );
        assert!(sql.ends_with("-- binds: [60000000, 5]"), "{sql}");
    }
}
