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

    /// This batch's window and limit, for `scope` instead (a handler of an
    /// `AllExcept` pass).
    pub(crate) fn with_scope<'q>(&self, scope: PruneScope<'q>) -> PruneBatchStatement<'q> {
        PruneBatchStatement {
            scope,
            keep: self.keep,
            keep_micros: self.keep_micros,
            limit: self.limit,
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

/// A backend's batch: `{head}{select} WHERE {key} < {cutoff} [scope]
/// ORDER BY {key} LIMIT {limit}{lock}{tail}`, which deletes the oldest
/// expired rows of the scope. The cutoff is the database clock minus the
/// window, bound in microseconds between `cutoff.0` and `cutoff.1`. A batch
/// over one handler picks with `one_handler`, any other with `all`.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
struct Delete {
    head: &'static str,
    one_handler: Pick,
    all: Pick,
    lock: &'static str,
    tail: &'static str,
}

/// How a batch picks its rows: which index it walks.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
struct Pick {
    /// `SELECT … FROM inbox_messages`, with an index hint where the backend
    /// has them.
    select: &'static str,
    /// `received_at` as the walked index has it.
    key: &'static str,
    cutoff: (&'static str, &'static str),
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

/// PostgreSQL: pick and lock the oldest expired rows, skipping rows another
/// transaction holds (a live handler, a second pruner), then delete them by
/// their physical address: a TID scan, no second index lookup.
///
/// PostgreSQL has no index hints. A batch over one handler compares and
/// orders by `received_at AT TIME ZONE 'UTC'` (the same instants), which only
/// the index on `(handler, (received_at AT TIME ZONE 'UTC'))` serves: on
/// `received_at` itself the planner would sometimes walk the `received_at`
/// index instead (its order is the table's, which makes it look cheap) and
/// read every other handler's row on the way.
#[cfg(feature = "postgres")]
pub(crate) fn walk_postgres<'b>(
    batch: &'b PruneBatchStatement<'_>,
    out: AstPass<'_, 'b, diesel::pg::Pg>,
) -> QueryResult<()> {
    Delete {
        head: "DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(",
        one_handler: Pick {
            select: "SELECT ctid FROM inbox_messages",
            key: "(received_at AT TIME ZONE 'UTC')",
            cutoff: (
                "((now() - ",
                " * INTERVAL '1 microsecond') AT TIME ZONE 'UTC')",
            ),
        },
        all: Pick {
            select: "SELECT ctid FROM inbox_messages",
            key: "received_at",
            cutoff: ("now() - ", " * INTERVAL '1 microsecond'"),
        },
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
/// The pick walks an index oldest first and stops after `limit` rows: for
/// one handler `(handler, received_at)`, which holds that handler's rows
/// only; otherwise `received_at`. InnoDB locks every row a locking read
/// passes, so the index decides which rows a batch holds. Left to itself,
/// the optimizer reads a one-handler scope through the primary key
/// (`handler = ?`) and sorts, locking every expired row of the handler in
/// every batch; through `received_at` it would lock every other handler's
/// row it walks past. So the index is forced. (A batch that reaches the end
/// of its scope also locks the index entry that ends it, the scope's next
/// row, until it commits: InnoDB reads one entry past a range.)
#[cfg(feature = "mysql")]
pub(crate) fn walk_mysql<'b>(
    batch: &'b PruneBatchStatement<'_>,
    out: AstPass<'_, 'b, diesel::mysql::Mysql>,
) -> QueryResult<()> {
    const CUTOFF: (&str, &str) = ("UTC_TIMESTAMP(6) - INTERVAL ", " MICROSECOND");
    Delete {
        head: "DELETE inbox_messages FROM (",
        one_handler: Pick {
            select: "SELECT handler, message_id FROM inbox_messages \
                     FORCE INDEX (inbox_messages_handler_received_at_idx)",
            key: "received_at",
            cutoff: CUTOFF,
        },
        all: Pick {
            select: "SELECT handler, message_id FROM inbox_messages \
                     FORCE INDEX (inbox_messages_received_at_idx)",
            key: "received_at",
            cutoff: CUTOFF,
        },
        lock: " FOR UPDATE SKIP LOCKED",
        tail: ") AS expired STRAIGHT_JOIN inbox_messages \
               ON inbox_messages.handler = expired.handler AND inbox_messages.message_id = expired.message_id",
    }
    .walk(batch, out)
}

/// SQLite: one writer at a time, so no row locks to skip; the table has no
/// rowid, so rows are picked by primary key. The cutoff is formatted like the
/// column (`YYYY-MM-DD HH:MM:SS.SSS`, UTC) so text comparison orders by time.
/// A batch over one handler walks `(handler, received_at)` (`INDEXED BY`).
#[cfg(feature = "sqlite")]
pub(crate) fn walk_sqlite<'b>(
    batch: &'b PruneBatchStatement<'_>,
    out: AstPass<'_, 'b, diesel::sqlite::Sqlite>,
) -> QueryResult<()> {
    const CUTOFF: (&str, &str) = (
        "strftime('%Y-%m-%d %H:%M:%f', 'now', printf('-%.6f seconds', ",
        " / 1000000.0))",
    );
    Delete {
        head: "DELETE FROM inbox_messages WHERE (handler, message_id) IN (",
        one_handler: Pick {
            select: "SELECT handler, message_id FROM inbox_messages \
                     INDEXED BY inbox_messages_handler_received_at_idx",
            key: "received_at",
            cutoff: CUTOFF,
        },
        all: Pick {
            select: "SELECT handler, message_id FROM inbox_messages",
            key: "received_at",
            cutoff: CUTOFF,
        },
        lock: "",
        tail: ")",
    }
    .walk(batch, out)
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
        let one =
            PruneBatchStatement::new(PruneScope::Handler(&list[0]), Duration::from_secs(1), 10);
        let sql = diesel::debug_query::<diesel::pg::Pg, _>(&one).to_string();
        assert_eq!(
            sql,
            "DELETE FROM inbox_messages WHERE ctid = ANY(ARRAY(SELECT ctid FROM inbox_messages \
             WHERE (received_at AT TIME ZONE 'UTC') < ((now() - $1 * INTERVAL '1 microsecond') AT TIME ZONE 'UTC') \
             AND handler = $2 ORDER BY (received_at AT TIME ZONE 'UTC') LIMIT $3 FOR UPDATE SKIP LOCKED)) \
             -- binds: [1000000, \"a\", 10]"
        );
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_sql() {
        let a = HandlerName::new("a").unwrap();
        let statement =
            PruneBatchStatement::new(PruneScope::Handler(&a), Duration::from_millis(1), 5);
        let sql = diesel::debug_query::<diesel::mysql::Mysql, _>(&statement).to_string();
        assert!(sql.starts_with("DELETE inbox_messages FROM (SELECT handler, message_id FROM inbox_messages FORCE INDEX (inbox_messages_handler_received_at_idx) WHERE received_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND handler = ? ORDER BY received_at LIMIT ? FOR UPDATE SKIP LOCKED) AS expired STRAIGHT_JOIN"), "{sql}");
        assert!(sql.ends_with("-- binds: [1000, \"a\", 5]"), "{sql}");
        let all = PruneBatchStatement::new(PruneScope::All, Duration::from_millis(1), 5);
        let sql = diesel::debug_query::<diesel::mysql::Mysql, _>(&all).to_string();
        assert!(
            sql.contains("FORCE INDEX (inbox_messages_received_at_idx) WHERE"),
            "{sql}"
        );
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
