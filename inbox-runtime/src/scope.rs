//! The transaction level a handler runs at, shared by the blocking and the
//! async runner: the SQL that begins, commits and rolls back that level, and
//! the bookkeeping that keeps Diesel's transaction depth in step with it.
//!
//! A handler runs either in a transaction of its own (`BEGIN`), or, when its
//! caller already opened one on the connection, in a savepoint named after
//! the depth it found (`inbox_savepoint_<depth>`, never one of Diesel's own
//! `diesel_savepoint_<n>` names). The runtime issues that SQL itself rather
//! than through Diesel's transaction manager, so that:
//!
//! - whatever the body left open (a nested `conn.transaction` it panicked
//!   out of), one `ROLLBACK` or `ROLLBACK TO SAVEPOINT` ends it, and the
//!   depth returns to the one the handler found;
//! - a rollback that fails is seen, never tolerated: MySQL/MariaDB roll the
//!   whole transaction back on a deadlock, so a savepoint that cannot be
//!   rolled back means the caller's transaction is gone, and the connection
//!   must refuse further work instead of running it in autocommit;
//! - the outermost commit can first check that the transaction is not
//!   aborted (PostgreSQL answers `COMMIT` with a silent `ROLLBACK` then).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use diesel::QueryResult;
use diesel::backend::Backend;
use diesel::connection::{
    Connection, TransactionDepthChange, TransactionManagerStatus, ValidTransactionManagerStatus,
};
use diesel::query_builder::{AstPass, QueryFragment, QueryId};

use crate::backend::{IdleBoundedBegin, InboxBackend, LateTripwire};
use crate::error::InboxError;
use crate::execution::depth;
use crate::recovery::is_transaction_aborted;
use crate::short_text::ShortText;

/// Where a handler's transaction sits: the depth it found the connection at.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    /// Diesel's transaction depth before the handler began (0: none open).
    base: u32,
    /// How the outermost level begins, commits and rolls back.
    outermost: Outermost,
    /// The backend's probe for an aborted transaction
    /// ([`InboxBackend::ABORTED_TRANSACTION_PROBE_SQL`]).
    aborted_probe_sql: Option<&'static str>,
    /// Whether a blocking connection sends the level's statements as
    /// prepared statements ([`InboxBackend::PREPARED_TRANSACTION_SQL`]).
    prepared_sql: bool,
    /// The outermost transaction with its tripwire set after the claim
    /// ([`InboxBackend::OUTERMOST_LATE_TRIPWIRE`]; `None` when bounded, and
    /// on a savepoint level).
    late_tripwire: Option<LateTripwire>,
}

/// The SQL of an outermost level, by backend and idle bound: each ending
/// is written out, with `end`, when it is sent.
#[derive(Debug, Clone)]
struct Outermost {
    begin: OutermostBegin,
    commit: &'static str,
    /// The commit of a duplicate's transaction
    /// ([`InboxBackend::OUTERMOST_DUPLICATE_COMMIT_SQL`]).
    duplicate_commit: &'static str,
    rollback: &'static str,
    /// What a bounded transaction's endings end with
    /// ([`InboxBackend::BOUNDED_IDLE_END_SQL`]; empty when unbounded).
    end: &'static str,
}

impl Outermost {
    /// `ending` followed by [`end`](Self::end) (inline: no allocation).
    fn ended(&self, ending: &'static str) -> ShortText {
        let mut text = ShortText::from_static(ending);
        if !self.end.is_empty() {
            text.push_str(self.end);
        }
        text
    }
}

/// How an outermost level begins: the backend's text, or one with an idle
/// bound, written out when sent.
#[derive(Debug, Clone, Copy)]
enum OutermostBegin {
    Fixed(&'static str),
    IdleBounded(IdleBoundedBegin),
}

impl OutermostBegin {
    /// The begin's text, followed by `; ` and `then` when given.
    fn sql(self, then: Option<&str>) -> ShortText {
        match (self, then) {
            (OutermostBegin::Fixed(sql), None) => ShortText::from_static(sql),
            (OutermostBegin::Fixed(sql), Some(then)) => {
                let mut text = ShortText::from_static(sql);
                text.push_str("; ");
                text.push_str(then);
                text
            }
            (OutermostBegin::IdleBounded(begin), then) => begin.text(then),
        }
    }
}

/// An outermost level's begin held for the claim (see
/// [`Scope::held_begin`]).
#[cfg(feature = "async")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldBegin {
    begin: OutermostBegin,
}

#[cfg(feature = "async")]
impl HeldBegin {
    /// The begin's text, as [`Scope::begin_sql`] gives it.
    pub(crate) fn sql(&self) -> ShortText {
        self.begin.sql(None)
    }

    /// The idle bound the begin sets, in seconds (see
    /// [`InboxBackend::bounded_idle_begin`]).
    pub(crate) fn idle_seconds(&self) -> Option<u64> {
        match self.begin {
            OutermostBegin::Fixed(_) => None,
            OutermostBegin::IdleBounded(begin) => Some(begin.bound),
        }
    }
}

impl Scope {
    /// The scope of a handler starting on a connection whose transaction
    /// manager is `status`; a broken one is refused with
    /// `BrokenTransactionManager`.
    pub(crate) fn new<DB: InboxBackend>(
        status: &mut TransactionManagerStatus,
    ) -> QueryResult<Self> {
        Self::bounded::<DB>(status, None)
    }

    /// [`new`](Self::new), for a handler whose outermost transaction the
    /// server must end (closing the connection) once it sits idle for longer
    /// than `idle_limit`, where the backend can (see
    /// [`InboxBackend::bounded_idle_begin`]). A savepoint in the caller's
    /// transaction is never bounded: that transaction is the caller's.
    pub(crate) fn bounded<DB: InboxBackend>(
        status: &mut TransactionManagerStatus,
        idle_limit: Option<std::time::Duration>,
    ) -> QueryResult<Self> {
        let base = depth(status)?;
        let bounded_begin = idle_limit
            .filter(|_| base == 0)
            .and_then(DB::bounded_idle_begin);
        let late_tripwire = match (base, &bounded_begin) {
            (0, None) => DB::OUTERMOST_LATE_TRIPWIRE,
            _ => None,
        };
        let (begin, end) = match bounded_begin {
            Some(begin) => (OutermostBegin::IdleBounded(begin), DB::BOUNDED_IDLE_END_SQL),
            None => (OutermostBegin::Fixed(DB::OUTERMOST_BEGIN_SQL), ""),
        };
        let outermost = Outermost {
            begin,
            commit: DB::OUTERMOST_COMMIT_SQL,
            duplicate_commit: DB::OUTERMOST_DUPLICATE_COMMIT_SQL,
            rollback: DB::OUTERMOST_ROLLBACK_SQL,
            end,
        };
        Ok(Scope {
            base,
            outermost,
            aborted_probe_sql: DB::ABORTED_TRANSACTION_PROBE_SQL,
            prepared_sql: DB::PREPARED_TRANSACTION_SQL,
            late_tripwire,
        })
    }

    /// Whether the handler opens the outermost transaction (no caller's
    /// transaction around it).
    pub(crate) fn is_outermost(&self) -> bool {
        self.base == 0
    }

    /// Begins the handler's level: `BEGIN`, or a savepoint in the caller's
    /// transaction.
    pub(crate) fn begin_sql(&self) -> ShortText {
        match self.is_outermost() {
            true => self.outermost.begin.sql(None),
            false => self.savepoint_sql("SAVEPOINT"),
        }
    }

    /// The outermost level's begin, for an executor that sends it later, in
    /// one text with the claim (see `delivery::asynchronous::Async`): `None`
    /// on a savepoint level.
    #[cfg(feature = "async")]
    pub(crate) fn held_begin(&self) -> Option<HeldBegin> {
        self.is_outermost().then_some(HeldBegin {
            begin: self.outermost.begin,
        })
    }

    /// The outermost level's begin followed by `then` in the same text
    /// (inline: no allocation): what an executor that holds the outermost
    /// `BEGIN` sends (see `delivery::pipelined`). `None` on a savepoint
    /// level.
    #[cfg(any(test, all(feature = "postgres", feature = "async")))]
    pub(crate) fn outermost_begin_then(&self, then: &str) -> Option<ShortText> {
        self.is_outermost()
            .then(|| self.outermost.begin.sql(Some(then)))
    }

    /// The outermost transaction with its tripwire set after the claim, if
    /// this is the outermost level and the backend has one (see
    /// [`InboxBackend::OUTERMOST_LATE_TRIPWIRE`]).
    pub(crate) fn late_tripwire(&self) -> Option<LateTripwire> {
        self.late_tripwire
    }

    /// Whether [`execute`](Self::execute) sends each statement of a text on
    /// its own, one round trip each (prepared statements on MySQL/MariaDB),
    /// rather than the whole text in one.
    pub(crate) fn sends_statements_one_by_one(&self) -> bool {
        self.prepared_sql && !PREPARING_REFUSED.load(Ordering::Relaxed)
    }

    /// Commits the handler's level; on the outermost level, with the
    /// backend's check that the transaction is not aborted.
    pub(crate) fn commit_sql(&self) -> ShortText {
        match self.is_outermost() {
            true => self.outermost.ended(self.outermost.commit),
            false => self.savepoint_sql("RELEASE SAVEPOINT"),
        }
    }

    /// Commits the handler's level after a claim that found its id taken,
    /// with no body run: on the outermost level without the backend's
    /// check ([`InboxBackend::OUTERMOST_DUPLICATE_COMMIT_SQL`]).
    pub(crate) fn duplicate_commit_sql(&self) -> ShortText {
        match self.is_outermost() {
            true => self.outermost.ended(self.outermost.duplicate_commit),
            false => self.commit_sql(),
        }
    }

    /// Rolls back the handler's level and everything the body opened above
    /// it.
    pub(crate) fn rollback_sql(&self) -> ShortText {
        match self.is_outermost() {
            true => self.outermost.ended(self.outermost.rollback),
            false => self.savepoint_sql("ROLLBACK TO SAVEPOINT"),
        }
    }

    /// Records in Diesel's transaction manager that the level began.
    pub(crate) fn entered(&self, status: &mut TransactionManagerStatus) -> QueryResult<()> {
        valid(status)?.change_transaction_depth(TransactionDepthChange::IncreaseDepth)
    }

    /// Records that the level (and whatever the body left open above it)
    /// ended: the depth is the handler's base again. Diesel's PostgreSQL
    /// connection may already have noticed the end of the outermost
    /// transaction on its own.
    pub(crate) fn left(&self, status: &mut TransactionManagerStatus) -> QueryResult<()> {
        while depth(status)? > self.base {
            valid(status)?.change_transaction_depth(TransactionDepthChange::DecreaseDepth)?;
        }
        Ok(())
    }

    /// Whether the handler's level is still open: `false` when the body
    /// ended it itself (committed or rolled back the handler's transaction).
    pub(crate) fn is_open(&self, status: &mut TransactionManagerStatus) -> QueryResult<bool> {
        Ok(depth(status)? > self.base)
    }

    /// Gives up on the connection after `source` left its transaction state
    /// unknown (a rollback failed, or the server ended the transaction
    /// behind Diesel's back): marks the transaction manager broken, so that
    /// nothing further runs on it outside a transaction, and says so.
    pub(crate) fn lose(
        &self,
        status: &mut TransactionManagerStatus,
        source: diesel::result::Error,
    ) -> InboxError {
        status.set_in_error();
        InboxError::TransactionLost {
            nested: !self.is_outermost(),
            source,
        }
    }

    /// Why a commit that failed with `commit_error` (and whose level was then
    /// rolled back) did not commit. `aborted`: the outermost transaction was
    /// found aborted by the backend's probe. A savepoint release fails on a
    /// backend that aborts transactions on a failed statement (PostgreSQL)
    /// for that same reason, since the rollback to the savepoint then
    /// succeeded.
    pub(crate) fn failed_commit(
        &self,
        aborted: bool,
        commit_error: diesel::result::Error,
    ) -> InboxError {
        let aborts_on_failed_statements = self.aborted_probe_sql.is_some();
        if aborted
            || (!self.is_outermost() && aborts_on_failed_statements)
            || (self.is_outermost() && is_transaction_aborted(&commit_error))
        {
            InboxError::IgnoredStatementFailure {
                source: commit_error,
            }
        } else {
            InboxError::Database(commit_error)
        }
    }

    /// After the outermost commit failed: a statement that fails again if
    /// the transaction is still open and aborted (`None`: the backend does
    /// not abort transactions on failed statements).
    pub(crate) fn aborted_probe_sql(&self) -> Option<&'static str> {
        if self.is_outermost() {
            self.aborted_probe_sql
        } else {
            None
        }
    }

    /// Runs one of the level's statements ([`begin_sql`](Self::begin_sql),
    /// [`commit_sql`](Self::commit_sql), [`rollback_sql`](Self::rollback_sql),
    /// the aborted probe) on a blocking connection, in one round trip.
    ///
    /// On MySQL/MariaDB each statement of `sql` goes as a prepared
    /// statement, which Diesel's statement cache keeps by its text and
    /// executes again in one round trip (`batch_execute` would cost three
    /// there), in order, stopping at the first that fails, as a
    /// multi-statement text does. A server that refuses to prepare one
    /// (nothing ran then) gets it and the rest through `batch_execute`, and
    /// so do all later statements of the process. Diesel's transaction depth
    /// is not touched: the caller keeps it in step
    /// ([`entered`](Self::entered), [`left`](Self::left)).
    pub(crate) fn execute<C: Connection>(&self, conn: &mut C, sql: &str) -> QueryResult<()> {
        if !self.prepared_sql {
            return conn.batch_execute(sql);
        }
        let mut rest = sql;
        while !rest.is_empty() && !PREPARING_REFUSED.load(Ordering::Relaxed) {
            let (statement, after) = rest.split_once(';').unwrap_or((rest, ""));
            let statement = statement.trim();
            let executed = match statement {
                "BEGIN" => diesel::RunQueryDsl::execute(Begin, conn),
                "COMMIT" => diesel::RunQueryDsl::execute(Commit, conn),
                "ROLLBACK" => diesel::RunQueryDsl::execute(Rollback, conn),
                sql => diesel::RunQueryDsl::execute(TransactionStatement { sql }, conn),
            };
            match executed {
                Err(diesel::result::Error::DatabaseError(_, info))
                    if info
                        .message()
                        .contains(crate::backend::mysql::PREPARED_STATEMENT_REFUSED) =>
                {
                    PREPARING_REFUSED.store(true, Ordering::Relaxed);
                }
                Err(error) => return Err(error),
                Ok(_) => rest = after.trim_start(),
            }
        }
        if rest.is_empty() {
            return Ok(());
        }
        conn.batch_execute(rest)
    }

    /// `statement` on this level's savepoint, named after its depth.
    fn savepoint_sql(&self, statement: &str) -> ShortText {
        let mut text = ShortText::new();
        // Writing to a `ShortText` cannot fail.
        let _ = write!(text, "{statement} inbox_savepoint_{}", self.base);
        text
    }
}

/// Set once a server refused to prepare a transaction statement: the
/// process sends them through `batch_execute` from then on.
static PREPARING_REFUSED: AtomicBool = AtomicBool::new(false);

/// A transaction statement as a prepared statement (see [`Scope::execute`]).
///
/// Its query id is not static, and it does not mark itself unsafe to cache:
/// Diesel's statement cache then keys it by its SQL text, prepares each
/// distinct text once per connection, and executes the cached statement
/// afterwards (one round trip).
struct TransactionStatement<'a> {
    sql: &'a str,
}

impl QueryId for TransactionStatement<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<C> diesel::RunQueryDsl<C> for TransactionStatement<'_> {}

/// The outermost level's statements, whose text never changes: cached
/// under their type, so executing one builds no SQL text to look it up.
macro_rules! fixed_statements {
    ($($name:ident => $sql:literal,)*) => {$(
        #[doc = concat!("`", $sql, "` as a prepared statement (see [`Scope::execute`]).")]
        #[derive(Debug, Clone, Copy, QueryId)]
        struct $name;

        impl<DB: Backend> QueryFragment<DB> for $name {
            fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
                out.push_sql($sql);
                Ok(())
            }
        }

        impl<C> diesel::RunQueryDsl<C> for $name {}
    )*};
}

fixed_statements! {
    Begin => "BEGIN",
    Commit => "COMMIT",
    Rollback => "ROLLBACK",
}

impl<DB: Backend> QueryFragment<DB> for TransactionStatement<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql(self.sql);
        Ok(())
    }
}

/// After a failure `cause`, the rollback failed with `rollback_error`:
/// which of the two to report. The rollback's failure (a lost transaction,
/// a broken connection) says more, unless it only says the transaction
/// manager was already broken: Diesel marks it so itself when it sees the
/// connection die (libpq's transaction status turns unknown), and then
/// `cause` (the body's error, the claim's, the commit's) tells why.
/// `Ok(cause)`: report the cause; `Err`: report the rollback's failure.
pub(crate) fn report_after_failed_rollback<T>(
    cause: T,
    rollback_error: InboxError,
) -> Result<T, InboxError> {
    match rollback_error {
        InboxError::Database(diesel::result::Error::BrokenTransactionManager) => Ok(cause),
        rollback_error => Err(rollback_error),
    }
}

/// The error either way (for [`report_after_failed_rollback`] when the cause
/// is an inbox error too).
pub(crate) fn either(report: Result<InboxError, InboxError>) -> InboxError {
    report.unwrap_or_else(|error| error)
}

fn valid(status: &mut TransactionManagerStatus) -> QueryResult<&mut ValidTransactionManagerStatus> {
    match status {
        TransactionManagerStatus::Valid(valid) => Ok(valid),
        TransactionManagerStatus::InError => Err(diesel::result::Error::BrokenTransactionManager),
    }
}

#[cfg(all(test, any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
mod tests {
    use super::*;

    #[cfg(feature = "sqlite")]
    type TestBackend = diesel::sqlite::Sqlite;
    #[cfg(all(not(feature = "sqlite"), feature = "postgres"))]
    type TestBackend = diesel::pg::Pg;
    #[cfg(all(not(feature = "sqlite"), not(feature = "postgres"), feature = "mysql"))]
    type TestBackend = diesel::mysql::Mysql;

    #[test]
    fn nested_levels_use_savepoints_named_after_their_depth() {
        let mut status = TransactionManagerStatus::default();
        let outer = Scope::new::<TestBackend>(&mut status).unwrap();
        assert!(outer.is_outermost());
        assert_eq!(outer.begin_sql(), TestBackend::OUTERMOST_BEGIN_SQL);
        assert_eq!(outer.rollback_sql(), TestBackend::OUTERMOST_ROLLBACK_SQL);
        outer.entered(&mut status).unwrap();

        let inner = Scope::new::<TestBackend>(&mut status).unwrap();
        assert!(!inner.is_outermost());
        assert_eq!(inner.begin_sql(), "SAVEPOINT inbox_savepoint_1");
        assert_eq!(
            inner.rollback_sql(),
            "ROLLBACK TO SAVEPOINT inbox_savepoint_1"
        );
        inner.entered(&mut status).unwrap();
        // A body that left two levels of its own open.
        inner.entered(&mut status).unwrap();
        inner.entered(&mut status).unwrap();
        assert!(inner.is_open(&mut status).unwrap());
        inner.left(&mut status).unwrap();
        assert_eq!(depth(&mut status).unwrap(), 1);
        assert!(!inner.is_open(&mut status).unwrap());
        outer.left(&mut status).unwrap();
        assert_eq!(depth(&mut status).unwrap(), 0);
    }

    /// What an executor holding the outermost begin sends: the level's
    /// begin and what follows it, in one text; nothing on a savepoint. On
    /// every backend built, with and without an idle bound (SQLite has
    /// none to write; PostgreSQL and MySQL do).
    #[test]
    fn the_outermost_begin_is_held_with_what_follows_it() {
        fn held<DB: InboxBackend>() {
            let mut status = TransactionManagerStatus::default();
            let limit = Some(std::time::Duration::from_secs(5));
            for idle_limit in [None, limit] {
                let outer = Scope::bounded::<DB>(&mut status, idle_limit).unwrap();
                let held = outer.outermost_begin_then("SET y = 1").unwrap();
                assert_eq!(held, format!("{}; SET y = 1", outer.begin_sql()));
                assert!(!held.is_on_heap());
                let bounded = DB::bounded_idle_begin(std::time::Duration::from_secs(5));
                if let (Some(_), Some(begin)) = (idle_limit, bounded) {
                    assert_eq!(outer.begin_sql(), begin.text(None));
                }
                outer.entered(&mut status).unwrap();
                let inner = Scope::bounded::<DB>(&mut status, idle_limit).unwrap();
                assert!(inner.outermost_begin_then("SET y = 1").is_none());
                outer.left(&mut status).unwrap();
            }
        }
        #[cfg(feature = "sqlite")]
        held::<diesel::sqlite::Sqlite>();
        #[cfg(feature = "postgres")]
        held::<diesel::pg::Pg>();
        #[cfg(feature = "mysql")]
        held::<diesel::mysql::Mysql>();
    }

    /// A level's endings, written inline: the backend's own on the
    /// outermost level, followed by its bounded end when the idle time is
    /// bounded; the savepoint's, named after the depth, above it.
    #[test]
    fn each_levels_endings_are_written_inline() {
        fn endings<DB: InboxBackend>() {
            let mut status = TransactionManagerStatus::default();
            let limit = Some(std::time::Duration::from_secs(5));
            for idle_limit in [None, limit] {
                let outer = Scope::bounded::<DB>(&mut status, idle_limit).unwrap();
                let end = match idle_limit.and_then(DB::bounded_idle_begin) {
                    Some(_) => DB::BOUNDED_IDLE_END_SQL,
                    None => "",
                };
                let texts = [
                    (outer.commit_sql(), DB::OUTERMOST_COMMIT_SQL),
                    (
                        outer.duplicate_commit_sql(),
                        DB::OUTERMOST_DUPLICATE_COMMIT_SQL,
                    ),
                    (outer.rollback_sql(), DB::OUTERMOST_ROLLBACK_SQL),
                ];
                for (text, ending) in texts {
                    assert_eq!(text, format!("{ending}{end}"));
                    assert!(!text.is_on_heap(), "{text}");
                }
                outer.entered(&mut status).unwrap();
                let inner = Scope::bounded::<DB>(&mut status, idle_limit).unwrap();
                assert_eq!(inner.begin_sql(), "SAVEPOINT inbox_savepoint_1");
                assert_eq!(inner.commit_sql(), "RELEASE SAVEPOINT inbox_savepoint_1");
                assert_eq!(inner.duplicate_commit_sql(), inner.commit_sql());
                assert!(!inner.rollback_sql().is_on_heap());
                outer.left(&mut status).unwrap();
            }
        }
        #[cfg(feature = "sqlite")]
        endings::<diesel::sqlite::Sqlite>();
        #[cfg(feature = "postgres")]
        endings::<diesel::pg::Pg>();
        #[cfg(feature = "mysql")]
        endings::<diesel::mysql::Mysql>();
    }

    #[test]
    fn a_lost_transaction_breaks_the_connection() {
        let mut status = TransactionManagerStatus::default();
        let scope = Scope::new::<TestBackend>(&mut status).unwrap();
        let error = scope.lose(&mut status, diesel::result::Error::NotFound);
        assert!(matches!(
            error,
            InboxError::TransactionLost { nested: false, .. }
        ));
        assert!(matches!(
            Scope::new::<TestBackend>(&mut status),
            Err(diesel::result::Error::BrokenTransactionManager)
        ));
    }
}
