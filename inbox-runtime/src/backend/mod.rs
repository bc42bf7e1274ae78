//! The database backends the inbox supports, and what differs between them.
//!
//! Everything backend-specific lives behind [`InboxBackend`], one file per
//! backend ([`postgres`], [`sqlite`], [`mysql`]): the schema and its
//! migrations, the claim statement, the pruning batch and its isolation,
//! the SQL that begins and ends a handler's transaction, and the server
//! messages that classify its errors. The rest of the runtime is written
//! once, generically over Diesel's `Connection`.
//!
//! This module depends on nothing of the runtime above it (only on
//! [`ClaimKey`]): the claim, the runners, pruning and error classification
//! call into it, never the reverse.
//!
//! Adding a backend: one file here implementing [`InboxBackend`] (and its
//! [`ServerMessages`], listed in [`SERVER_MESSAGES`]), its migrations under
//! `migrations/<backend>/`, and its feature in `Cargo.toml`.

use diesel::QueryResult;
use diesel::backend::Backend;
use diesel::query_builder::AstPass;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use diesel::sql_types::Text;

use crate::fingerprint::Fingerprint;
use crate::key::ClaimKey;

mod batch_claim;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) mod cached;
mod failure_rows;
pub(crate) mod mysql;
mod outbox_sql;
pub(crate) mod postgres;
pub(crate) mod prune_batch;
pub(crate) mod shaped;
pub(crate) mod sqlite;
pub(crate) mod stored_claim;

pub use batch_claim::BatchClaimed;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use batch_claim::values_sql;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) use batch_claim::{BatchReports, InsertedId};
pub use failure_rows::{DeadLetterRow, Present, SummaryRow};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) use outbox_sql::outbox_leasable;
pub use outbox_sql::{BacklogRow, DeadOutboxRow, KeyedInsert, Lease, OutboxRow, OutboxSql};
#[cfg(feature = "postgres")]
pub(crate) use outbox_sql::{DeletingLease, RESTORE_BINDS};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use outbox_sql::{insert_text, push_hex_digits};
pub(crate) use prune_batch::NextHandler;
pub use prune_batch::{PruneBatchStatement, PruneScope, PrunedTable};
pub use stored_claim::{ReadingClaimRow, StoredClaimRow, StoredClaimSql};

/// A Diesel backend the inbox can store claims in: PostgreSQL (`postgres`
/// feature), SQLite (`sqlite`) or MySQL/MariaDB (`mysql`).
///
/// The claim is one statement that inserts the `(handler, message_id)` row
/// and reports, by its affected-row count, whether the row is new. It never
/// checks before inserting and never relies on catching a unique violation
/// (which would abort a PostgreSQL transaction):
///
/// | backend | claim statement |
/// |---|---|
/// | PostgreSQL, SQLite | `INSERT … ON CONFLICT (handler, message_id) DO NOTHING` |
/// | MySQL, MariaDB | `INSERT IGNORE …` (ids are validated first, since `IGNORE` would also silence truncation) |
///
/// A concurrent delivery of the same id blocks on the first one's row lock
/// until that transaction commits (then it is a duplicate) or rolls back
/// (then it claims the id itself).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use inbox_runtime::InboxBackend;
/// assert!(<diesel::sqlite::Sqlite as InboxBackend>::CREATE_SCHEMA_SQL.contains("inbox_messages"));
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "the inbox does not support the `{Self}` database backend",
    label = "no inbox schema or claim statement for `{Self}`",
    note = "the inbox supports PostgreSQL, SQLite and MySQL/MariaDB: enable the `postgres`, `sqlite` or `mysql` feature of `inbox-runtime`, and make a generic connection's `Backend` one of them"
)]
pub trait InboxBackend: Backend + sealed::Sealed {
    /// SQL that creates the inbox table and its indexes as the latest
    /// migration leaves them; safe to run again. On PostgreSQL and MySQL it
    /// also adds to an inbox created by an earlier version what it lacks (an
    /// index; on PostgreSQL the `received_at` default). An SQLite table
    /// created before 2026-12-03 needs a rebuild, which
    /// [`setup`](crate::setup) does and this SQL does not.
    const CREATE_SCHEMA_SQL: &'static str;
    /// SQL that drops the inbox's tables.
    const DROP_SCHEMA_SQL: &'static str;

    /// The statements of failed attempts, dead messages and their operator
    /// surface (see [`FailureSql`]).
    #[doc(hidden)]
    const FAILURE_SQL: FailureSql;

    /// The outbox's statements (see [`OutboxSql`]).
    #[doc(hidden)]
    const OUTBOX_SQL: OutboxSql;

    /// [`OUTBOX_SQL`](Self::OUTBOX_SQL)'s unkeyed insert with its values
    /// written into the text, for a backend that sends it in the commit's
    /// round trip (a multi-statement text): `None` where it would save
    /// nothing (SQLite runs in process). Collected only where the commit
    /// is one text (not where each statement of a commit is a cached
    /// prepared statement of its own: Diesel's blocking MySQL/MariaDB
    /// connection).
    #[doc(hidden)]
    fn outbox_insert_text(
        _id: &str,
        _destination: &str,
        _headers: &[u8],
        _payload: &[u8],
    ) -> Option<String> {
        None
    }

    /// Brings an inbox that [`CREATE_SCHEMA_SQL`](Self::CREATE_SCHEMA_SQL)
    /// found in place up to date, where SQL that is safe to run again cannot
    /// (SQLite: the rebuild of its 2026-12-03 migration, only for a table
    /// that still has the old checks). Run by [`setup`](crate::setup) after
    /// that SQL.
    #[doc(hidden)]
    fn upgrade_schema<C>(conn: &mut C) -> QueryResult<()>
    where
        C: diesel::Connection<Backend = Self>,
    {
        let _ = conn;
        Ok(())
    }

    /// Runs `create` ([`setup`](crate::setup)'s statements) so that setups
    /// started at once (services starting together) take turns: two
    /// creations of one catalog entry would race and one would fail. SQLite
    /// has one writer at a time already.
    #[doc(hidden)]
    fn setup_in_turn<C, F>(conn: &mut C, create: F) -> QueryResult<()>
    where
        C: diesel::Connection<Backend = Self>,
        F: FnOnce(&mut C) -> QueryResult<()>,
    {
        create(conn)
    }

    /// Begins a handler's outermost transaction. On MySQL/MariaDB InnoDB
    /// rolls the whole transaction back on a deadlock (or a lock wait
    /// timeout with `innodb_rollback_on_timeout`), claim included; a body
    /// that ignores the error would then write its later statements in
    /// autocommit mode, each committed at once, and a plain `COMMIT` would
    /// report success. So the transaction runs with `autocommit = 0` (later
    /// statements then open a new transaction instead, which the runner can
    /// still roll back) and begins with a savepoint that dies with it: the
    /// commit releases that savepoint first, which fails once the
    /// transaction it was set in is gone (see
    /// [`OUTERMOST_COMMIT_SQL`](Self::OUTERMOST_COMMIT_SQL)).
    #[doc(hidden)]
    const OUTERMOST_BEGIN_SQL: &'static str;

    /// Rolls back a handler's outermost transaction (on MySQL/MariaDB, and
    /// restores `autocommit`).
    #[doc(hidden)]
    const OUTERMOST_ROLLBACK_SQL: &'static str;

    /// Commits a handler's outermost transaction. On MySQL/MariaDB it first
    /// releases the savepoint [`OUTERMOST_BEGIN_SQL`](Self::OUTERMOST_BEGIN_SQL)
    /// set (a failure stops the statements before the commit, and the runner
    /// rolls back), then commits by turning `autocommit` back on and
    /// restores its saved value, in one statement. On PostgreSQL it first runs
    /// a statement that fails when the transaction is aborted (a failed
    /// statement whose error the body ignored), because PostgreSQL answers
    /// `COMMIT` in an aborted transaction with a silent `ROLLBACK`; both go
    /// in one round trip.
    #[doc(hidden)]
    const OUTERMOST_COMMIT_SQL: &'static str;

    /// Commits a handler's outermost transaction in which the claim found
    /// its id taken and no body ran (a duplicate): on PostgreSQL without
    /// [`OUTERMOST_COMMIT_SQL`](Self::OUTERMOST_COMMIT_SQL)'s check, which
    /// has nothing to find there (the claim succeeded, and nothing else
    /// ran); elsewhere the same.
    #[doc(hidden)]
    const OUTERMOST_DUPLICATE_COMMIT_SQL: &'static str;

    /// The same outermost transaction with its tripwire (the savepoint of
    /// [`OUTERMOST_BEGIN_SQL`](Self::OUTERMOST_BEGIN_SQL)) left for after
    /// the claim, for connections that pay a round trip per statement: a
    /// single delivery's claim writes a claim token that its commit checks
    /// instead, and a batch sets the savepoint once its ids are claimed,
    /// so a duplicate, whose body never runs, pays for no tripwire. `None`
    /// where the outermost transaction has no tripwire.
    #[doc(hidden)]
    const OUTERMOST_LATE_TRIPWIRE: Option<LateTripwire>;

    /// How a blocking connection sends the runner's transaction statements
    /// (`BEGIN`, `COMMIT`, `ROLLBACK`, `SAVEPOINT`, `RELEASE SAVEPOINT`,
    /// `ROLLBACK TO SAVEPOINT`): `false` through `batch_execute`, `true` as
    /// prepared statements that Diesel's statement cache keeps, executed
    /// again in one round trip each. MySQL's blocking `batch_execute`
    /// switches multi-statement mode on and off around every call (three
    /// round trips); PostgreSQL's and SQLite's cost one already, and
    /// PostgreSQL's commit is two statements in one round trip.
    #[doc(hidden)]
    const PREPARED_TRANSACTION_SQL: bool;

    /// After [`OUTERMOST_COMMIT_SQL`](Self::OUTERMOST_COMMIT_SQL) failed:
    /// a statement that fails again if the transaction is still open and
    /// aborted, and succeeds if the `COMMIT` itself failed (which ends the
    /// transaction). `None` where the commit has no check.
    #[doc(hidden)]
    const ABORTED_TRANSACTION_PROBE_SQL: Option<&'static str>;

    /// Begins an async handler's outermost transaction so that the server
    /// ends it (closing the connection) once it sits idle for longer than
    /// `limit`: what bounds how long a dropped handler future keeps its
    /// claim locked. `None`: the backend has no such setting. The text is
    /// written out when it is sent ([`IdleBoundedBegin::text`]).
    #[doc(hidden)]
    fn bounded_idle_begin(limit: std::time::Duration) -> Option<IdleBoundedBegin>;

    /// Appended to the `COMMIT` and `ROLLBACK` of a transaction begun with
    /// [`bounded_idle_begin`](Self::bounded_idle_begin): restores
    /// what it changed for the session (`""`: nothing to restore).
    #[doc(hidden)]
    const BOUNDED_IDLE_END_SQL: &'static str;

    /// Writes the claim statement for `key`, storing `fingerprint` with it
    /// when given (used by `ClaimStatement` and its fingerprinted twin).
    #[doc(hidden)]
    fn walk_claim<'b>(
        key: &'b ClaimKey,
        fingerprint: Option<&'b Fingerprint>,
        out: AstPass<'_, 'b, Self>,
    ) -> QueryResult<()>;

    /// Whether the claim can be bounded ([`walk_bounded_claim`](Self::walk_bounded_claim)):
    /// `false` for SQLite, whose single writer waits as the connection's
    /// `busy_timeout` says, and for a MySQL server that refused the bound.
    #[doc(hidden)]
    fn bounds_claims() -> bool;

    /// Whether a bounded claim's text carries the bound's value (MariaDB's
    /// `SET STATEMENT … FOR`): Diesel then caches it by its text. Where it
    /// does not (`false`: a bind on PostgreSQL, not written on SQLite), the
    /// text is fixed by the claim's shape and cached by a type (`shaped`).
    #[doc(hidden)]
    const BOUND_IN_CLAIM_TEXT: bool;

    /// Writes the claim statement for `key` that waits at most `bound` for
    /// a claim of the same key still in flight, and leaves the session's
    /// lock wait as it found it for what follows (only when
    /// [`bounds_claims`](Self::bounds_claims)).
    #[doc(hidden)]
    fn walk_bounded_claim<'b>(
        key: &'b ClaimKey,
        fingerprint: Option<&'b Fingerprint>,
        bound: &'b ClaimBound,
        out: AstPass<'_, 'b, Self>,
    ) -> QueryResult<()>;

    /// Whether [`walk_reading_claim`](Self::walk_reading_claim) is written
    /// for a claim that writes the session's claim token if `token` (see
    /// [`LateTripwire`]), and the server has not refused it
    /// ([`reading_claim_refused`](Self::reading_claim_refused)): a claim
    /// that also reads what the claim it met stored, so that a
    /// fingerprinted or result-storing duplicate costs the round trip of a
    /// plain one.
    #[doc(hidden)]
    fn claim_reads_stored(token: bool) -> bool;

    /// Whether the claim given a fingerprint ([`walk_claim`](Self::walk_claim))
    /// compares it with the one stored with a claim it meets: it reports
    /// no row for a duplicate whose claim stored the same fingerprint, or
    /// none, and fails, changing nothing and leaving the transaction open,
    /// where the claim stored another
    /// ([`claim_met_another_fingerprint`](Self::claim_met_another_fingerprint)),
    /// so that a fingerprinted duplicate sends the statements of a plain
    /// one.
    #[doc(hidden)]
    const FINGERPRINTED_CLAIM_COMPARES: bool = false;

    /// Whether `error` is the failure of a claim that compares fingerprints
    /// ([`FINGERPRINTED_CLAIM_COMPARES`](Self::FINGERPRINTED_CLAIM_COMPARES))
    /// meeting a claim stored with another fingerprint.
    #[doc(hidden)]
    fn claim_met_another_fingerprint(error: &diesel::result::Error) -> bool {
        let _ = error;
        false
    }

    /// Whether [`push_begin_and_claim`](Self::push_begin_and_claim) writes
    /// a text: an executor that sends a text of several statements in one
    /// round trip then holds the outermost begin for the claim.
    #[doc(hidden)]
    const CLAIMS_AS_TEXT: bool = false;

    /// Writes to `text` the outermost begin (with the idle bound of
    /// `idle_seconds`, see [`bounded_idle_begin`](Self::bounded_idle_begin))
    /// followed by the plain claim of `key` (no fingerprint) with literal
    /// values, bounded as [`walk_bounded_claim`](Self::walk_bounded_claim)
    /// is, for an executor that sends them in one text (diesel-async on
    /// MySQL/MariaDB, which sends a text of several statements in one round
    /// trip, where a prepared claim costs one of its own): whether it wrote
    /// them (`false`, and `text` untouched, where the backend has no such
    /// text or `key` has a fingerprint). The begin's tripwire is the one of
    /// [`OUTERMOST_BEGIN_SQL`](Self::OUTERMOST_BEGIN_SQL), set before the
    /// claim; the claim writes no claim token. It inserts without ignoring
    /// a duplicate: a duplicate fails it with a unique violation, the
    /// claim's answer (a text's statements report no affected rows). A
    /// text stops at its first failing statement, so the claim never runs
    /// after a begin that failed.
    #[doc(hidden)]
    fn push_begin_and_claim(
        text: &mut String,
        idle_seconds: Option<u64>,
        key: &ClaimKey,
        bound: Option<ClaimBound>,
    ) -> bool {
        let _ = (text, idle_seconds, key, bound);
        false
    }

    /// `None` where the server describes the columns of the reading claim
    /// ([`walk_reading_claim`](Self::walk_reading_claim)) when it prepares
    /// it. MariaDB describes those of `INSERT … RETURNING` only once it has
    /// run it, and Diesel's blocking connections read a statement's columns
    /// before they run it: there a connection's first reading claim fails,
    /// having run nothing, and runs without reading its row, which this
    /// query (binds `(handler, message_id)`, in the claim's transaction)
    /// reads instead; the statement the connection caches knows its columns
    /// from then on ([`load_reading_claim`](Self::load_reading_claim)).
    #[doc(hidden)]
    const READING_CLAIM_ROW_SQL: Option<&'static str> = None;

    /// Whether `error` is the server refusing the reading claim's syntax
    /// (MySQL, and MariaDB before 10.5: no `INSERT … RETURNING`): it ran
    /// nothing, the backend records it, so that the process claims and
    /// reads in two statements from then on, and the delivery claims again
    /// that way.
    #[doc(hidden)]
    fn reading_claim_refused(error: &diesel::result::Error) -> bool {
        let _ = error;
        false
    }

    /// Writes the claim of `key` (storing `fingerprint`, bounded by
    /// `bound`, when given) that returns one [`ReadingClaimRow`]: whether it
    /// claimed the key and, when it did not, the fingerprint and result
    /// stored with the claim it met, if the statement's snapshot sees that
    /// claim (`seen`; a claim committed while this one waited for it is
    /// not seen, nor one in an archived generation: read it then with
    /// [`STORED_CLAIM_SQL`](Self::STORED_CLAIM_SQL)). Only where
    /// [`claim_reads_stored`](Self::claim_reads_stored); elsewhere an
    /// error, and never sent.
    #[doc(hidden)]
    fn walk_reading_claim<'b>(
        key: &'b ClaimKey,
        fingerprint: Option<&'b Fingerprint>,
        bound: Option<&'b ClaimBound>,
        out: AstPass<'_, 'b, Self>,
    ) -> QueryResult<()> {
        let _ = (key, fingerprint, bound, out);
        Err(diesel::result::Error::QueryBuilderError(
            "this backend's claim does not read what it met".into(),
        ))
    }

    /// Whether `error` is the server refusing the bounded claim's syntax (a
    /// MySQL server: no `SET STATEMENT`); recorded, so that the process
    /// sends unbounded claims from then on.
    #[doc(hidden)]
    fn bounded_claim_refused(error: &diesel::result::Error) -> bool {
        let _ = error;
        false
    }

    /// Writes the claim statement for `key` that also writes the session's
    /// claim token (see [`LateTripwire`]), bounded as
    /// [`walk_bounded_claim`](Self::walk_bounded_claim) is when `bound` is
    /// given. Refused where
    /// [`OUTERMOST_LATE_TRIPWIRE`](Self::OUTERMOST_LATE_TRIPWIRE) is `None`.
    #[doc(hidden)]
    fn walk_token_claim<'b>(
        key: &'b ClaimKey,
        fingerprint: Option<&'b Fingerprint>,
        bound: Option<&'b ClaimBound>,
        out: AstPass<'_, 'b, Self>,
    ) -> QueryResult<()> {
        let _ = (key, fingerprint, bound, out);
        Err(diesel::result::Error::QueryBuilderError(
            "this backend's claims write no claim token".into(),
        ))
    }

    /// Writes the commit of a single delivery whose claim of `key` wrote the
    /// session's claim token: it commits and restores the session if the
    /// claim's row is there with that token, and otherwise fails,
    /// committing nothing (the error is one of the backend's
    /// `transaction_aborted` messages). Refused where
    /// [`OUTERMOST_LATE_TRIPWIRE`](Self::OUTERMOST_LATE_TRIPWIRE) is `None`.
    #[doc(hidden)]
    fn walk_claim_check<'b>(key: &'b ClaimKey, out: AstPass<'_, 'b, Self>) -> QueryResult<()> {
        let _ = (key, out);
        Err(diesel::result::Error::QueryBuilderError(
            "this backend's claims write no claim token".into(),
        ))
    }

    /// Whether `error` is a token-writing claim refused by a schema that
    /// has no column for the token (an inbox created before it, whose
    /// migration has not run yet): nothing ran, and the delivery claims
    /// again without the token, with a savepoint as its tripwire.
    #[doc(hidden)]
    fn claim_token_refused(error: &diesel::result::Error) -> bool {
        let _ = error;
        false
    }

    /// The most ids one batch claim statement takes: what keeps its bound
    /// parameters under the backend's limit (SQLite's is 999 on old builds).
    #[doc(hidden)]
    const MAX_CLAIMS_PER_STATEMENT: usize;

    /// Claims the distinct `ids` of `handler` in one statement, inside the
    /// transaction open on `conn`, and says which ones it inserted. A
    /// statement over ids in one order (the caller sorts them) takes its row
    /// locks in that order, so two batches never deadlock on their claims.
    #[doc(hidden)]
    fn claim_batch<C>(
        conn: &mut C,
        handler: &str,
        ids: &[&str],
        bound: Option<&ClaimBound>,
    ) -> QueryResult<BatchClaimed>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// [`claim_batch`](Self::claim_batch) on a diesel-async connection.
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn claim_batch_async<'c, C>(
        conn: &'c mut C,
        handler: &'c str,
        ids: &'c [&'c str],
        bound: Option<&'c ClaimBound>,
    ) -> impl std::future::Future<Output = QueryResult<BatchClaimed>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;

    /// Writes one pruning batch (used by [`PruneBatchStatement`]).
    #[doc(hidden)]
    fn walk_prune_batch<'b>(
        batch: &'b PruneBatchStatement<'_>,
        out: AstPass<'_, 'b, Self>,
    ) -> QueryResult<()>;

    /// The first handler name after `after` in the inbox (`""`: the first of
    /// all), `None` past the last: one index probe. A pruning pass over every
    /// handler but some walks the handlers with it.
    #[doc(hidden)]
    fn next_prune_handler<C>(conn: &mut C, after: &str) -> QueryResult<Option<String>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// [`next_prune_handler`](Self::next_prune_handler) on a diesel-async
    /// connection.
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn next_prune_handler_async<'c, C>(
        conn: &'c mut C,
        after: &'c str,
    ) -> impl std::future::Future<Output = QueryResult<Option<String>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;

    /// The statements of payload fingerprints and stored results (see
    /// [`StoredClaimSql`]).
    #[doc(hidden)]
    const STORED_CLAIM_SQL: StoredClaimSql;

    /// The claim of `key` that reads what the claim it met stored
    /// ([`walk_reading_claim`](Self::walk_reading_claim)), bounded by
    /// `bound` when given: its one row.
    #[doc(hidden)]
    fn load_reading_claim<C>(
        conn: &mut C,
        key: &ClaimKey,
        bound: Option<ClaimBound>,
    ) -> QueryResult<Vec<ReadingClaimRow>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// [`load_reading_claim`](Self::load_reading_claim) on a diesel-async
    /// connection.
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn load_reading_claim_async<'c, C>(
        conn: &'c mut C,
        key: &'c ClaimKey,
        bound: Option<ClaimBound>,
    ) -> impl std::future::Future<Output = QueryResult<Vec<ReadingClaimRow>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;

    /// The fingerprint and result stored with a claim: `sql` (one of
    /// [`STORED_CLAIM_SQL`](Self::STORED_CLAIM_SQL)'s selects) with `binds`,
    /// as a prepared statement the connection caches (a duplicate's read
    /// costs one round trip, not a prepare and an execute).
    #[doc(hidden)]
    fn load_stored_claim<C>(
        conn: &mut C,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> QueryResult<Vec<StoredClaimRow>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// [`load_stored_claim`](Self::load_stored_claim) on a diesel-async
    /// connection.
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn load_stored_claim_async<'c, C>(
        conn: &'c mut C,
        sql: &'static str,
        binds: &'c [Bind<'c>],
    ) -> impl std::future::Future<Output = QueryResult<Vec<StoredClaimRow>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;

    /// Runs `sql` (one of [`FAILURE_SQL`](Self::FAILURE_SQL)'s or
    /// [`OUTBOX_SQL`](Self::OUTBOX_SQL)'s statements, the latter perhaps
    /// with positions appended) with `binds` bound in order: the affected
    /// rows. Never a cached prepared statement.
    #[doc(hidden)]
    fn execute_bound<C>(conn: &mut C, sql: &str, binds: &[Bind<'_>]) -> QueryResult<usize>
    where
        C: diesel::Connection<Backend = Self>;

    /// [`execute_bound`](Self::execute_bound) on a diesel-async connection.
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn execute_bound_async<'c, C>(
        conn: &'c mut C,
        sql: &'c str,
        binds: &'c [Bind<'c>],
    ) -> impl std::future::Future<Output = QueryResult<usize>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;

    /// Runs `sql`, one of the backend's fixed statements, with `binds` as a
    /// prepared statement the connection caches (see
    /// [`cached`](crate::backend::cached)): the affected rows. What the
    /// statements of a delivery run as.
    #[doc(hidden)]
    fn execute_cached<C>(conn: &mut C, sql: &'static str, binds: &[Bind<'_>]) -> QueryResult<usize>
    where
        C: diesel::Connection<Backend = Self>;

    /// [`execute_cached`](Self::execute_cached) on a diesel-async
    /// connection.
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn execute_cached_async<'c, C>(
        conn: &'c mut C,
        sql: &'static str,
        binds: &'c [Bind<'c>],
    ) -> impl std::future::Future<Output = QueryResult<usize>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;

    /// The outbox rows `sql` (one of [`OUTBOX_SQL`](Self::OUTBOX_SQL)'s
    /// leases) returns with `binds`, as a cached prepared statement (see
    /// [`execute_cached`](Self::execute_cached)).
    #[doc(hidden)]
    fn load_outbox_rows<C>(
        conn: &mut C,
        sql: &'static str,
        binds: &[Bind<'_>],
    ) -> QueryResult<Vec<OutboxRow>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// [`load_outbox_rows`](Self::load_outbox_rows) on a diesel-async
    /// connection.
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn load_outbox_rows_async<'c, C>(
        conn: &'c mut C,
        sql: &'static str,
        binds: &'c [Bind<'c>],
    ) -> impl std::future::Future<Output = QueryResult<Vec<OutboxRow>>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;

    /// One page of dead outgoing messages ([`OutboxSql::list_dead`]).
    #[doc(hidden)]
    fn load_dead_outbox<C>(conn: &mut C, binds: &[Bind<'_>]) -> QueryResult<Vec<DeadOutboxRow>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// The outbox's backlog ([`OutboxSql::backlog`]).
    #[doc(hidden)]
    fn load_outbox_backlog<C>(conn: &mut C) -> QueryResult<Vec<BacklogRow>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// One page of dead messages ([`FailureSql::list_dead`]).
    #[doc(hidden)]
    fn load_dead_letters<C>(conn: &mut C, binds: &[Bind<'_>]) -> QueryResult<Vec<DeadLetterRow>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// Dead messages per handler ([`FailureSql::dead_summary`]).
    #[doc(hidden)]
    fn load_dead_summary<C>(conn: &mut C) -> QueryResult<Vec<SummaryRow>>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// The `present` column of the one row `sql` returns.
    #[doc(hidden)]
    fn load_flag<C>(conn: &mut C, sql: &'static str) -> QueryResult<bool>
    where
        C: diesel::connection::LoadConnection<Backend = Self>;

    /// [`load_flag`](Self::load_flag) on a diesel-async connection.
    #[cfg(feature = "async")]
    #[doc(hidden)]
    fn load_flag_async<'c, C>(
        conn: &'c mut C,
        sql: &'static str,
    ) -> impl std::future::Future<Output = QueryResult<bool>> + Send + 'c
    where
        C: diesel_async::AsyncConnection<Backend = Self>;

    /// SQL run right before a pruning batch's transaction begins (`""`: none).
    #[doc(hidden)]
    const PRUNE_BEFORE_BEGIN_SQL: &'static str;

    /// SQL run first inside a pruning batch's transaction (`""`: none).
    #[doc(hidden)]
    const PRUNE_AFTER_BEGIN_SQL: &'static str;
}

/// An outermost transaction whose tripwire is set after the claim (see
/// [`InboxBackend::OUTERMOST_LATE_TRIPWIRE`]): each text is one statement.
///
/// A single delivery's tripwire is its claim itself: [`begin`](Self::begin)
/// gives the session a claim token new to the delivery, its claim writes
/// that token into the claim's row, and its commit
/// ([`InboxBackend::walk_claim_check`]) commits only if that row is there
/// with that token. A rollback the server made on its own (a
/// deadlock) takes the row away with the rest, and another delivery that
/// claims the id since writes its own token. A batch's claim writes no
/// token (one statement claims many ids), so a batch sets the savepoint
/// [`set`](Self::set) once its ids are claimed.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct LateTripwire {
    /// Begins the transaction, without the tripwire, and gives the session
    /// a claim token new to it.
    pub begin: &'static str,
    /// Sets a batch's tripwire, once its ids are claimed and before a body
    /// runs.
    pub set: &'static str,
    /// Ends a transaction whose tripwire was never set (a duplicate's, which
    /// wrote nothing): commits it and restores the session.
    pub end_unset: &'static str,
    /// [`end_unset`](Self::end_unset) for the duplicate of a fingerprinted
    /// claim, whose stored fingerprint was not read: fails, changing
    /// nothing, if the claim it met stored another fingerprint (a claim
    /// without one matches any). Run in the duplicate's outermost
    /// transaction, which has read nothing yet, so its read sees the
    /// claim the duplicate met. Binds: the delivery's fingerprint, the
    /// handler, the message id.
    pub end_duplicate_checked: &'static str,
    /// After a commit that checks the token failed without saying why
    /// (Galera replays a transaction an applier aborted while it
    /// committed, then fails the `SET` that committed it: "Incorrect
    /// arguments to SET") and the transaction was rolled back: the claim's
    /// fingerprint and result (a [`StoredClaimRow`]) if the claim of that
    /// key with the session's token is committed, no row otherwise. The
    /// token is the transaction's own, so a row means that the failed
    /// commit committed. Binds: the handler, the message id.
    pub committed_claim: &'static str,
}

/// A claim's bound on its wait for a claim of the same key in flight, as
/// the backends write it: whole milliseconds (PostgreSQL's `lock_timeout`,
/// at least 1: 0 would mean none; at most `i32::MAX`, its largest) and
/// whole seconds rounded up (InnoDB's `innodb_lock_wait_timeout`, at most
/// [`MAX_LOCK_WAIT_SECONDS`], its largest).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimBound {
    /// Milliseconds, at least 1.
    pub(crate) millis: i32,
    /// Seconds, rounded up.
    pub(crate) seconds: u64,
}

impl ClaimBound {
    /// The bound of `wait`.
    pub(crate) fn of(wait: std::time::Duration) -> ClaimBound {
        let millis = wait.as_millis();
        ClaimBound {
            millis: i32::try_from(millis).unwrap_or(i32::MAX).max(1),
            seconds: wait
                .as_secs()
                .saturating_add(u64::from(wait.subsec_nanos() > 0))
                .min(MAX_LOCK_WAIT_SECONDS),
        }
    }
}

/// The longest `innodb_lock_wait_timeout` MySQL and MariaDB take, in
/// seconds (about 34 years): a longer bound waits this long.
const MAX_LOCK_WAIT_SECONDS: u64 = 1_073_741_824;

/// The text that begins an outermost transaction the server ends once it
/// sits idle for longer than a bound ([`InboxBackend::bounded_idle_begin`]):
/// `before`, the bound in the backend's unit, `after`. Kept as its parts
/// and written out once, when it is sent.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleBoundedBegin {
    pub(crate) before: &'static str,
    pub(crate) bound: u64,
    pub(crate) after: &'static str,
}

impl IdleBoundedBegin {
    /// The text, followed by `; ` and `then` when given (inline: no
    /// allocation, see [`ShortText`](crate::short_text::ShortText)).
    pub(crate) fn text(&self, then: Option<&str>) -> crate::short_text::ShortText {
        use std::fmt::Write;
        let mut text = crate::short_text::ShortText::new();
        text.push_str(self.before);
        // Writing to a `ShortText` cannot fail.
        let _ = write!(text, "{}", self.bound);
        text.push_str(self.after);
        if let Some(then) = then {
            text.push_str("; ");
            text.push_str(then);
        }
        text
    }
}

/// One backend's statements over `inbox_failures`. Each takes its binds in
/// the order given (PostgreSQL numbers them, so a value used twice is bound
/// twice on every backend). Times are read as microseconds since the Unix
/// epoch.
#[doc(hidden)]
#[derive(Debug)]
pub struct FailureSql {
    /// Counts one failed attempt: `(handler, message_id, last_error)`.
    pub(crate) record_attempt: &'static str,
    /// Marks the message dead if its attempts reached the limit and it is
    /// not dead yet: `(handler, message_id, limit)`; one row when it did.
    pub(crate) mark_exhausted: &'static str,
    /// Marks the message dead as rejected: `(handler, message_id)`.
    pub(crate) mark_rejected: &'static str,
    /// One page of a handler's dead messages, oldest first: `(handler,
    /// after_micros, after_micros, after_message_id, limit)`.
    pub(crate) list_dead: &'static str,
    /// Dead messages per handler: `handler`, `dead`, `oldest_micros`.
    pub(crate) dead_summary: &'static str,
    /// Deletes the claims of dead messages, so the next delivery runs:
    /// `(handler, handler, message_id or NULL, message_id or NULL)`.
    pub(crate) revive_claims: &'static str,
    /// Where claims can also sit in archived generations (PostgreSQL's
    /// partitioned layout): a query telling whether that table exists
    /// (`present`), and the delete of [`revive_claims`](Self::revive_claims)
    /// there.
    pub(crate) archived_claims: Option<(&'static str, &'static str)>,
    /// Deletes the dead-message records: `(handler, message_id or NULL,
    /// message_id or NULL)`.
    pub(crate) forget_dead: &'static str,
}

/// A value bound to a statement of [`FailureSql`].
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum Bind<'a> {
    /// Text.
    Text(&'a str),
    /// Text or `NULL`.
    OptionalText(Option<&'a str>),
    /// A 32-bit integer.
    Integer(i32),
    /// A 64-bit integer.
    BigInt(i64),
    /// A 64-bit integer or `NULL`.
    OptionalBigInt(Option<i64>),
    /// Bytes.
    Bytes(&'a [u8]),
}

/// `(handler, message_id)` of `key` as binds, in that order: what every
/// statement about one claim binds first.
pub(crate) fn key_binds(key: &ClaimKey) -> [Bind<'_>; 2] {
    [
        Bind::Text(key.handler().as_str()),
        Bind::Text(key.message_id()),
    ]
}

/// Binds `binds` to `query` in order ([`InboxBackend::bound_statement`] as
/// every backend implements it).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn bind_all<'a, DB>(
    mut query: BoxedSqlQuery<'a, DB, SqlQuery>,
    binds: &[Bind<'a>],
) -> BoxedSqlQuery<'a, DB, SqlQuery>
where
    DB: Backend
        + diesel::sql_types::HasSqlType<Text>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Integer>
        + diesel::sql_types::HasSqlType<diesel::sql_types::BigInt>,
    &'a str: diesel::serialize::ToSql<Text, DB>
        + diesel::serialize::ToSql<diesel::sql_types::Nullable<Text>, DB>,
    i32: diesel::serialize::ToSql<diesel::sql_types::Integer, DB>,
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, DB>
        + diesel::serialize::ToSql<diesel::sql_types::Nullable<diesel::sql_types::BigInt>, DB>,
    DB: diesel::sql_types::HasSqlType<diesel::sql_types::Binary>,
    &'a [u8]: diesel::serialize::ToSql<diesel::sql_types::Binary, DB>,
{
    use diesel::sql_types::{BigInt, Binary, Integer, Nullable};
    for bind in binds {
        query = match *bind {
            Bind::Text(text) => query.bind::<Text, _>(text),
            Bind::OptionalText(text) => query.bind::<Nullable<Text>, _>(text),
            Bind::Integer(value) => query.bind::<Integer, _>(value),
            Bind::BigInt(value) => query.bind::<BigInt, _>(value),
            Bind::OptionalBigInt(value) => query.bind::<Nullable<BigInt>, _>(value),
            Bind::Bytes(bytes) => query.bind::<Binary, _>(bytes),
        };
    }
    query
}

pub(crate) mod sealed {
    /// Only the backends of this module implement [`InboxBackend`](super::InboxBackend).
    pub trait Sealed {}
}

/// Pushes the claim's columns and values: `(handler, message_id) VALUES
/// (?, ?)`, with the `fingerprint` column and its bytes when one is given.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn push_claim_row<'b, DB>(
    key: &'b ClaimKey,
    fingerprint: Option<&'b Fingerprint>,
    out: &mut AstPass<'_, 'b, DB>,
) -> QueryResult<()>
where
    DB: Backend
        + diesel::sql_types::HasSqlType<Text>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Binary>,
    str: diesel::serialize::ToSql<Text, DB>,
    [u8]: diesel::serialize::ToSql<diesel::sql_types::Binary, DB>,
{
    push_claim_columns(key, fingerprint, ("VALUES (", ")"), None, out)
}

/// [`push_claim_row`] with one more column, `also`'s name and the SQL of
/// its value: `(handler, message_id[, fingerprint], name) VALUES (?, ?[,
/// ?], value)` (MySQL's claim token, see [`LateTripwire`]).
#[cfg(feature = "mysql")]
pub(crate) fn push_claim_row_with<'b, DB>(
    key: &'b ClaimKey,
    fingerprint: Option<&'b Fingerprint>,
    also: (&'static str, &'static str),
    out: &mut AstPass<'_, 'b, DB>,
) -> QueryResult<()>
where
    DB: Backend
        + diesel::sql_types::HasSqlType<Text>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Binary>,
    str: diesel::serialize::ToSql<Text, DB>,
    [u8]: diesel::serialize::ToSql<diesel::sql_types::Binary, DB>,
{
    push_claim_columns(key, fingerprint, ("VALUES (", ")"), Some(also), out)
}

/// [`push_claim_row`] as a `SELECT` of the values (`(handler, message_id[,
/// fingerprint]) SELECT $1, $2[, $3]`), for a claim that reads them `FROM`
/// a step before it.
#[cfg(feature = "postgres")]
pub(crate) fn push_claim_select<'b>(
    key: &'b ClaimKey,
    fingerprint: Option<&'b Fingerprint>,
    out: &mut AstPass<'_, 'b, diesel::pg::Pg>,
) -> QueryResult<()> {
    push_claim_columns(key, fingerprint, ("SELECT ", ""), None, out)
}

/// The claim's columns (and `also`'s, see [`push_claim_row_with`]), then
/// its values as binds between `around`'s two texts.
fn push_claim_columns<'b, DB>(
    key: &'b ClaimKey,
    fingerprint: Option<&'b Fingerprint>,
    around: (&str, &str),
    also: Option<(&'static str, &'static str)>,
    out: &mut AstPass<'_, 'b, DB>,
) -> QueryResult<()>
where
    DB: Backend
        + diesel::sql_types::HasSqlType<Text>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Binary>,
    str: diesel::serialize::ToSql<Text, DB>,
    [u8]: diesel::serialize::ToSql<diesel::sql_types::Binary, DB>,
{
    match fingerprint {
        None => out.push_sql("(handler, message_id"),
        Some(_) => out.push_sql("(handler, message_id, fingerprint"),
    }
    if let Some((column, _)) = also {
        out.push_sql(", ");
        out.push_sql(column);
    }
    out.push_sql(") ");
    out.push_sql(around.0);
    out.push_bind_param::<Text, str>(key.handler().as_str())?;
    out.push_sql(", ");
    out.push_bind_param::<Text, str>(key.message_id())?;
    if let Some(fingerprint) = fingerprint {
        out.push_sql(", ");
        out.push_bind_param::<diesel::sql_types::Binary, [u8]>(fingerprint.as_bytes())?;
    }
    if let Some((_, value)) = also {
        out.push_sql(", ");
        out.push_sql(value);
    }
    out.push_sql(around.1);
    Ok(())
}

/// The claim for backends with `ON CONFLICT` (PostgreSQL, SQLite). Naming the
/// conflict target keeps every other constraint violation an error.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn walk_insert_on_conflict_do_nothing<'b, DB>(
    key: &'b ClaimKey,
    fingerprint: Option<&'b Fingerprint>,
    mut out: AstPass<'_, 'b, DB>,
) -> QueryResult<()>
where
    DB: Backend
        + diesel::sql_types::HasSqlType<Text>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Binary>,
    str: diesel::serialize::ToSql<Text, DB>,
    [u8]: diesel::serialize::ToSql<diesel::sql_types::Binary, DB>,
{
    out.push_sql("INSERT INTO inbox_messages ");
    push_claim_row(key, fingerprint, &mut out)?;
    out.push_sql(" ON CONFLICT (handler, message_id) DO NOTHING");
    Ok(())
}

/// Includes a file of one of this crate's migrations:
/// `migration_sql!("postgres", "2026-12-01-000000_create_inbox_messages", "up.sql")`.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! migration_sql {
    ($backend:literal, $migration:literal, $file:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/migrations/",
            $backend,
            "/",
            $migration,
            "/",
            $file
        ))
    };
}
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) use migration_sql;

/// [`InboxBackend::next_prune_handler`] and
/// [`InboxBackend::next_prune_handler_async`] as every backend implements
/// them: [`NextHandler`] on the connection. Invoked inside each backend's
/// `impl InboxBackend`, where the backend is known (which a default method
/// is not).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! next_prune_handler_fns {
    () => {
        fn next_prune_handler<C>(conn: &mut C, after: &str) -> QueryResult<Option<String>>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            crate::backend::prune_batch::next_handler(conn, after)
        }

        #[cfg(feature = "async")]
        fn next_prune_handler_async<'c, C>(
            conn: &'c mut C,
            after: &'c str,
        ) -> impl std::future::Future<Output = QueryResult<Option<String>>> + Send + 'c
        where
            C: diesel_async::AsyncConnection<Backend = Self>,
        {
            crate::backend::prune_batch::next_handler_async(conn, after)
        }
    };
}
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) use next_prune_handler_fns;

/// [`InboxBackend::execute_bound`], [`InboxBackend::execute_bound_async`]
/// and [`InboxBackend::load_bound`] as every backend implements them.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! bound_statement_fn {
    () => {
        fn execute_bound<C>(
            conn: &mut C,
            sql: &str,
            binds: &[crate::backend::Bind<'_>],
        ) -> QueryResult<usize>
        where
            C: diesel::Connection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            crate::backend::bind_all(diesel::sql_query(sql).into_boxed::<Self>(), binds)
                .execute(conn)
        }

        #[cfg(feature = "async")]
        fn execute_bound_async<'c, C>(
            conn: &'c mut C,
            sql: &'c str,
            binds: &'c [crate::backend::Bind<'c>],
        ) -> impl std::future::Future<Output = QueryResult<usize>> + Send + 'c
        where
            C: diesel_async::AsyncConnection<Backend = Self>,
        {
            use diesel_async::RunQueryDsl;
            crate::backend::bind_all(diesel::sql_query(sql).into_boxed::<Self>(), binds)
                .execute(conn)
        }

        fn execute_cached<C>(
            conn: &mut C,
            sql: &'static str,
            binds: &[crate::backend::Bind<'_>],
        ) -> QueryResult<usize>
        where
            C: diesel::Connection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            crate::backend::cached::CachedStatement::new(sql, binds).execute(conn)
        }

        #[cfg(feature = "async")]
        fn execute_cached_async<'c, C>(
            conn: &'c mut C,
            sql: &'static str,
            binds: &'c [crate::backend::Bind<'c>],
        ) -> impl std::future::Future<Output = QueryResult<usize>> + Send + 'c
        where
            C: diesel_async::AsyncConnection<Backend = Self>,
        {
            use diesel_async::RunQueryDsl;
            crate::backend::cached::CachedStatement::new(sql, binds).execute(conn)
        }

        fn load_outbox_rows<C>(
            conn: &mut C,
            sql: &'static str,
            binds: &[crate::backend::Bind<'_>],
        ) -> QueryResult<Vec<crate::backend::OutboxRow>>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            crate::backend::cached::CachedStatement::new(sql, binds).load(conn)
        }

        #[cfg(feature = "async")]
        fn load_outbox_rows_async<'c, C>(
            conn: &'c mut C,
            sql: &'static str,
            binds: &'c [crate::backend::Bind<'c>],
        ) -> impl std::future::Future<Output = QueryResult<Vec<crate::backend::OutboxRow>>>
        + Send
        + 'c
        where
            C: diesel_async::AsyncConnection<Backend = Self>,
        {
            use diesel_async::RunQueryDsl;
            crate::backend::cached::CachedStatement::new(sql, binds).load(conn)
        }

        fn load_dead_outbox<C>(
            conn: &mut C,
            binds: &[crate::backend::Bind<'_>],
        ) -> QueryResult<Vec<crate::backend::DeadOutboxRow>>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            let sql = <Self as crate::backend::InboxBackend>::OUTBOX_SQL.list_dead;
            crate::backend::bind_all(diesel::sql_query(sql).into_boxed::<Self>(), binds).load(conn)
        }

        fn load_outbox_backlog<C>(conn: &mut C) -> QueryResult<Vec<crate::backend::BacklogRow>>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            diesel::sql_query(<Self as crate::backend::InboxBackend>::OUTBOX_SQL.backlog).load(conn)
        }

        fn load_dead_letters<C>(
            conn: &mut C,
            binds: &[crate::backend::Bind<'_>],
        ) -> QueryResult<Vec<crate::backend::DeadLetterRow>>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            let sql = <Self as crate::backend::InboxBackend>::FAILURE_SQL.list_dead;
            crate::backend::bind_all(diesel::sql_query(sql).into_boxed::<Self>(), binds).load(conn)
        }

        fn load_dead_summary<C>(conn: &mut C) -> QueryResult<Vec<crate::backend::SummaryRow>>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            diesel::sql_query(<Self as crate::backend::InboxBackend>::FAILURE_SQL.dead_summary)
                .load(conn)
        }

        fn load_reading_claim<C>(
            conn: &mut C,
            key: &crate::key::ClaimKey,
            bound: Option<crate::backend::ClaimBound>,
        ) -> QueryResult<Vec<crate::backend::ReadingClaimRow>>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            let statement = crate::backend::stored_claim::ReadingClaimStatement { key, bound };
            let rows = crate::backend::shaped::by_shape!(Self, statement, |claim| claim.load(conn));
            match (rows, <Self as crate::backend::InboxBackend>::READING_CLAIM_ROW_SQL) {
                // The statement's columns unknown until it ran (nothing
                // ran), or its row unreadable once it did (running it
                // again in this transaction meets the claim it made): run
                // it, and read its row apart.
                (Err(diesel::result::Error::DeserializationError(_)), Some(row)) => {
                    crate::backend::shaped::by_shape!(Self, statement, |claim| {
                        claim.execute(conn)
                    })?;
                    let binds = crate::backend::key_binds(key);
                    crate::backend::cached::CachedStatement::new(row, &binds).load(conn)
                }
                (rows, _) => rows,
            }
        }

        #[cfg(feature = "async")]
        fn load_reading_claim_async<'c, C>(
            conn: &'c mut C,
            key: &'c crate::key::ClaimKey,
            bound: Option<crate::backend::ClaimBound>,
        ) -> impl std::future::Future<Output = QueryResult<Vec<crate::backend::ReadingClaimRow>>>
        + Send
        + 'c
        where
            C: diesel_async::AsyncConnection<Backend = Self>,
        {
            use diesel_async::RunQueryDsl;
            let statement = crate::backend::stored_claim::ReadingClaimStatement { key, bound };
            async move {
                crate::backend::shaped::by_shape!(Self, statement, |claim| claim.load(conn).await)
            }
        }

        fn load_stored_claim<C>(
            conn: &mut C,
            sql: &'static str,
            binds: &[crate::backend::Bind<'_>],
        ) -> QueryResult<Vec<crate::backend::StoredClaimRow>>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            crate::backend::cached::CachedStatement::new(sql, binds).load(conn)
        }

        #[cfg(feature = "async")]
        fn load_stored_claim_async<'c, C>(
            conn: &'c mut C,
            sql: &'static str,
            binds: &'c [crate::backend::Bind<'c>],
        ) -> impl std::future::Future<Output = QueryResult<Vec<crate::backend::StoredClaimRow>>>
        + Send
        + 'c
        where
            C: diesel_async::AsyncConnection<Backend = Self>,
        {
            use diesel_async::RunQueryDsl;
            crate::backend::cached::CachedStatement::new(sql, binds).load(conn)
        }

        fn load_flag<C>(conn: &mut C, sql: &'static str) -> QueryResult<bool>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            let rows: Vec<crate::backend::Present> = diesel::sql_query(sql).load(conn)?;
            Ok(rows.first().is_some_and(|row| row.present))
        }

        #[cfg(feature = "async")]
        fn load_flag_async<'c, C>(
            conn: &'c mut C,
            sql: &'static str,
        ) -> impl std::future::Future<Output = QueryResult<bool>> + Send + 'c
        where
            C: diesel_async::AsyncConnection<Backend = Self>,
        {
            use diesel_async::RunQueryDsl;
            async move {
                let rows: Vec<crate::backend::Present> = diesel::sql_query(sql)
                    .into_boxed::<Self>()
                    .load(conn)
                    .await?;
                Ok(rows.into_iter().next().is_some_and(|row| row.present))
            }
        }
    };
}
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) use bound_statement_fn;

/// [`InboxBackend::claim_batch`] and [`InboxBackend::claim_batch_async`] as
/// every backend implements them, from its `claim_batch_query(handler, ids)`
/// (the statement, bound) and `CLAIM_BATCH_REPORTS` (how it tells which ids
/// it inserted), both in the backend's file.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! claim_batch_fns {
    () => {
        fn claim_batch<C>(
            conn: &mut C,
            handler: &str,
            ids: &[&str],
            bound: Option<&crate::backend::ClaimBound>,
        ) -> QueryResult<crate::backend::BatchClaimed>
        where
            C: diesel::connection::LoadConnection<Backend = Self>,
        {
            use diesel::RunQueryDsl;
            let query = claim_batch_query(handler, ids, bound);
            match CLAIM_BATCH_REPORTS {
                crate::backend::BatchReports::Returning => {
                    let rows: Vec<crate::backend::InsertedId> = query.load(conn)?;
                    Ok(crate::backend::BatchClaimed::returned(rows))
                }
                crate::backend::BatchReports::Count => Ok(
                    crate::backend::BatchClaimed::from_count(ids, query.execute(conn)?),
                ),
            }
        }

        #[cfg(feature = "async")]
        fn claim_batch_async<'c, C>(
            conn: &'c mut C,
            handler: &'c str,
            ids: &'c [&'c str],
            bound: Option<&'c crate::backend::ClaimBound>,
        ) -> impl std::future::Future<Output = QueryResult<crate::backend::BatchClaimed>> + Send + 'c
        where
            C: diesel_async::AsyncConnection<Backend = Self>,
        {
            use diesel_async::RunQueryDsl;
            async move {
                let query = claim_batch_query(handler, ids, bound);
                match CLAIM_BATCH_REPORTS {
                    crate::backend::BatchReports::Returning => {
                        let rows: Vec<crate::backend::InsertedId> = query.load(conn).await?;
                        Ok(crate::backend::BatchClaimed::returned(rows))
                    }
                    crate::backend::BatchReports::Count => Ok(
                        crate::backend::BatchClaimed::from_count(ids, query.execute(conn).await?),
                    ),
                }
            }
        }
    };
}
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) use claim_batch_fns;

/// What a backend's server (and its drivers) say when a statement fails in
/// a way the error's kind does not tell: `(server code, message text)`
/// pairs, matched by substring. Read by [`recovery`](crate::recovery()) only, for every
/// backend at once (a Diesel error does not say which backend sent it), so
/// every table is compiled whatever the features.
#[derive(Debug)]
pub(crate) struct ServerMessages {
    /// A lock conflict the database resolved by rolling back (deadlock,
    /// serialization failure, lock wait timeout), reported as `Unknown`.
    pub(crate) lock_conflict: &'static [(&'static str, &'static str)],
    /// A statement that gave up waiting for a lock another transaction
    /// holds (its lock wait timeout, the database busy): on a bounded
    /// claim, a delivery of the same id in flight.
    pub(crate) lock_wait_timeout: &'static [(&'static str, &'static str)],
    /// A connection that is gone or cannot write: reported as `Unknown`, or
    /// under a kind that would otherwise mean something else.
    pub(crate) connection_lost: &'static [(&'static str, &'static str)],
    /// The server refused the text of an id, reported as `Unknown`.
    pub(crate) refused_text: &'static [(&'static str, &'static str)],
    /// A statement refused because an earlier one failed and aborted the
    /// transaction (PostgreSQL), reported as `Unknown`.
    pub(crate) transaction_aborted: &'static [(&'static str, &'static str)],
    /// The connection's prepared statements are not the server's: the
    /// driver's statement cache names one the server does not have (or
    /// has under another text), as after `DEALLOCATE ALL` or behind a
    /// pooler that hands each transaction another server connection. Every
    /// cached statement fails on that connection for ever.
    pub(crate) statements_lost: &'static [(&'static str, &'static str)],
    /// A commit that failed without saying why, which may have committed:
    /// Galera's failed `SET` after it replayed the transaction that `SET`
    /// committed.
    pub(crate) commit_unanswered: &'static [(&'static str, &'static str)],
}

/// Failures of the operating system's sockets, whatever the backend.
const IO_MESSAGES: ServerMessages = ServerMessages {
    lock_conflict: &[],
    lock_wait_timeout: &[],
    connection_lost: &[("io", "Broken pipe"), ("io", "Connection reset by peer")],
    refused_text: &[],
    transaction_aborted: &[],
    statements_lost: &[],
    commit_unanswered: &[],
};

/// Every backend's messages, and the operating system's.
pub(crate) const SERVER_MESSAGES: [&ServerMessages; 4] = [
    &postgres::MESSAGES,
    &mysql::MESSAGES,
    &sqlite::MESSAGES,
    &IO_MESSAGES,
];

#[cfg(test)]
mod tests {
    /// The schema's SQL is sent as the client's text, which a server whose
    /// database encoding is not UTF-8 (PostgreSQL `LATIN1`) converts: a
    /// character it has no equivalent for, even in a comment, fails the
    /// whole setup. So it is plain ASCII.
    #[test]
    fn the_schema_sql_is_ascii() {
        let mut schemas: Vec<(&str, &str)> = Vec::new();
        #[cfg(feature = "postgres")]
        schemas.push((
            "postgres",
            <diesel::pg::Pg as super::InboxBackend>::CREATE_SCHEMA_SQL,
        ));
        #[cfg(feature = "mysql")]
        schemas.push((
            "mysql",
            <diesel::mysql::Mysql as super::InboxBackend>::CREATE_SCHEMA_SQL,
        ));
        #[cfg(feature = "sqlite")]
        schemas.push((
            "sqlite",
            <diesel::sqlite::Sqlite as super::InboxBackend>::CREATE_SCHEMA_SQL,
        ));
        for (name, sql) in schemas {
            let odd = sql.char_indices().find(|(_, c)| !c.is_ascii());
            assert_eq!(odd, None, "{name}: not ASCII at (byte, char)");
        }
    }

    /// An idle-bounded begin is written out as each backend's text, alone
    /// or with what follows it.
    #[test]
    fn an_idle_bounded_begin_is_written_out_whole() {
        for bound in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX] {
            let begin = super::IdleBoundedBegin {
                before: "SET x = ",
                bound,
                after: "; BEGIN",
            };
            let text = begin.text(None);
            assert_eq!(text, format!("SET x = {bound}; BEGIN"));
            let then = begin.text(Some("SET y = 1"));
            assert_eq!(then, format!("SET x = {bound}; BEGIN; SET y = 1"));
        }
        let limit = std::time::Duration::from_millis(1_500);
        #[cfg(feature = "postgres")]
        assert_eq!(
            <diesel::pg::Pg as super::InboxBackend>::bounded_idle_begin(limit)
                .map(|begin| begin.text(None).to_string()),
            Some("BEGIN; SET LOCAL idle_in_transaction_session_timeout = 1500".to_owned())
        );
        #[cfg(feature = "mysql")]
        assert_eq!(
            <diesel::mysql::Mysql as super::InboxBackend>::bounded_idle_begin(limit)
                .map(|begin| begin.text(None).to_string()),
            Some(
                "SET @inbox_saved_wait_timeout = @@SESSION.wait_timeout, \
                 SESSION wait_timeout = 2, @inbox_saved_autocommit = @@SESSION.autocommit, \
                 SESSION autocommit = 0, @inbox_claim_token = UNHEX(REPLACE(UUID(), '-', '')); \
                 SAVEPOINT inbox_transaction"
                    .to_owned()
            )
        );
        #[cfg(feature = "sqlite")]
        assert_eq!(
            <diesel::sqlite::Sqlite as super::InboxBackend>::bounded_idle_begin(limit),
            None
        );
    }

    /// A claim's bound in each backend's unit: whole milliseconds (at least
    /// one) and whole seconds rounded up, at most what each server takes,
    /// however long the wait (no overflow at `Duration::MAX`).
    #[test]
    fn a_claim_bound_is_written_in_each_servers_range() {
        use std::time::Duration;
        let of = |wait| {
            let bound = super::ClaimBound::of(wait);
            (bound.millis, bound.seconds)
        };
        assert_eq!(of(Duration::ZERO), (1, 0));
        assert_eq!(of(Duration::from_micros(1)), (1, 1));
        assert_eq!(of(Duration::from_millis(1500)), (1500, 2));
        assert_eq!(of(Duration::from_secs(2)), (2000, 2));
        let longest = (i32::MAX, super::MAX_LOCK_WAIT_SECONDS);
        assert_eq!(
            of(Duration::from_secs(super::MAX_LOCK_WAIT_SECONDS)),
            longest
        );
        assert_eq!(of(Duration::from_secs(u64::MAX)), longest);
        assert_eq!(of(Duration::MAX), longest);
    }

    /// Each backend's idle-bounded begin, at the longest bound and with
    /// what an executor sends after it, is written without an allocation.
    #[test]
    fn every_idle_bounded_begin_is_written_inline() {
        let longest = std::time::Duration::MAX;
        #[cfg(feature = "postgres")]
        {
            let begin = <diesel::pg::Pg as super::InboxBackend>::bounded_idle_begin(longest)
                .expect("PostgreSQL bounds the idle time");
            assert!(!begin.text(None).is_on_heap());
            #[cfg(feature = "async")]
            assert!(
                !begin
                    .text(Some(super::postgres::PIPELINED_CLAIMING_SQL))
                    .is_on_heap()
            );
        }
        #[cfg(feature = "mysql")]
        {
            let begin = <diesel::mysql::Mysql as super::InboxBackend>::bounded_idle_begin(longest)
                .expect("MySQL bounds the idle time");
            assert!(!begin.text(None).is_on_heap());
        }
    }
}
