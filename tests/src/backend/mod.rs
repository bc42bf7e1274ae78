//! [`TestBackend`]: a database of a test's own on one backend, and what the
//! suites need to know about that backend; [`ServerBackend`]: what only a
//! database server (not embedded SQLite) has. One file per backend.

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "mysql")]
pub use self::mysql::Mysql;
#[cfg(feature = "postgres")]
pub use self::postgres::{
    NoStatementCache, PgEncodedDatabase, Postgres, behind_pgbouncer, skipped_behind_pgbouncer,
};
#[cfg(feature = "sqlite")]
pub use self::sqlite::Sqlite;

use diesel::connection::LoadConnection;
use diesel::r2d2::{ConnectionManager, Pool, R2D2Connection};
use inbox_runtime::InboxBackend;

use crate::SqlRows;

/// Diesel's backend type of a [`TestBackend`]'s connections (`diesel::pg::Pg`, …).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// let _: Option<inbox_tests::DieselBackend<inbox_tests::Sqlite>> = None::<diesel::sqlite::Sqlite>;
/// # }
/// ```
pub type DieselBackend<B> = <<B as TestBackend>::Connection as diesel::Connection>::Backend;

/// One backend's test database — a fresh PostgreSQL schema, MariaDB/MySQL
/// database or SQLite file with the inbox table, removed on drop — and
/// everything that differs between backends in the tests: connection types,
/// pools, and the few SQL expressions that are not portable.
///
/// A test is a generic function over `B: TestBackend`, instantiated per
/// backend by [`backend_tests!`](crate::backend_tests). Adding a backend is
/// one file in `src/backend/` and one arm of that macro.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use inbox_tests::{Sqlite, TestBackend};
///
/// fn inbox_starts_empty<B: TestBackend>() {
///     let Some(db) = B::open() else { return }; // `skipped:` printed
///     let mut conn = db.connect();
///     let _ = &mut conn;
///     assert!(!B::NAME.is_empty());
/// }
/// inbox_starts_empty::<Sqlite>();
/// # }
/// ```
pub trait TestBackend: Sized + Send + Sync + 'static {
    /// The backend's blocking connection type ([`SqlRows`]: a generic test
    /// reads back its own SQL's rows).
    type Connection: R2D2Connection
        + LoadConnection<Backend: InboxBackend>
        + SqlRows
        + Send
        + 'static;

    /// The backend's diesel-async connection type (SQLite's is Diesel's
    /// blocking connection in diesel-async's `SyncConnectionWrapper`;
    /// [`AsyncSqlRows`](crate::AsyncSqlRows): a generic async test reads
    /// back its own SQL's rows).
    #[cfg(feature = "async")]
    type AsyncConnection: diesel_async::AsyncConnection<Backend = DieselBackend<Self>>
        + diesel_async::pooled_connection::PoolableConnection
        + crate::AsyncSqlRows
        + Send
        + 'static;

    /// A short name for the backend, for test output (`postgres`, `mysql`,
    /// `sqlite`): the name of its `backend_tests!` module and feature.
    const NAME: &'static str;

    /// Whether a failed statement aborts the whole transaction until it
    /// rolls back (PostgreSQL), rather than being undone on its own while
    /// the transaction goes on (MariaDB/MySQL, SQLite).
    const FAILED_STATEMENT_ABORTS_TRANSACTION: bool;

    /// The age of a row's `received_at` by the database clock, in
    /// microseconds, as a `BIGINT` expression.
    const RECEIVED_AGE_MICROS_SQL: &'static str;

    /// A column type whose comparisons are exact whatever the server's
    /// default collation, like the inbox's own columns (`TEXT`; bytes,
    /// `VARBINARY(255)`, on MariaDB/MySQL).
    const EXACT_TEXT_TYPE: &'static str;

    /// How many threads a race of deliveries runs: SQLite has one writer at
    /// a time, so more threads there only add busy-waiting.
    const RACE_THREADS: usize;

    /// Whether a storm of claims that keep rolling back can outlast the
    /// runtime's claim retries (InnoDB: waiters on a rolled-back claim
    /// deadlock on the key's gap lock; the victims' claims are retried, and
    /// the retries can run out with a retryable `SerializationFailure`).
    const ROLLBACK_STORMS_MAY_OUTLAST_CLAIM_RETRIES: bool;

    /// Whether this run leaves the backend's async tests out, after saying
    /// why: PostgreSQL behind PgBouncer (see [`crate::behind_pgbouncer`]).
    fn skips_async() -> bool {
        false
    }

    /// Whether a test that needs a server session of its own per
    /// connection (to watch or kill it by its id, or a session setting)
    /// should return, after saying `why`: behind PgBouncer's transaction
    /// pooling a connection has none.
    fn skipped_without_sessions(why: &str) -> bool {
        let _ = why;
        false
    }

    /// A fresh database with the inbox table, or `None` (after a loud
    /// `skipped:` line) when the server cannot be reached and
    /// `INBOX_REQUIRE_DATABASES` is not set. SQLite never skips.
    fn open() -> Option<Self>;

    /// The URL of this database (a file path for SQLite).
    fn url(&self) -> &str;

    /// A new connection to this database.
    fn connect(&self) -> Self::Connection;

    /// An r2d2 pool builder for this backend's connections, with what every
    /// connection the harness makes needs (behind PgBouncer: the statement
    /// cache off), for a pool to a URL of the test's choosing (a proxy).
    fn pool_builder() -> diesel::r2d2::Builder<ConnectionManager<Self::Connection>> {
        Pool::builder()
    }

    /// An r2d2 pool of `size` connections to this database.
    fn pool(&self, size: u32) -> Pool<ConnectionManager<Self::Connection>> {
        Self::pool_builder()
            .max_size(size)
            .build(ConnectionManager::new(self.url()))
            .expect("build a pool")
    }

    /// SQL for the database-clock time `seconds` ago, in `received_at`'s type.
    fn ago_sql(seconds: i64) -> String;

    /// The inbox table as the first version's `setup()` created it: the
    /// inbox's first migration (its `up.sql`), to upgrade from.
    const FIRST_SCHEMA_SQL: &'static str;

    /// The inbox table as the database describes it, one `value` row (for
    /// [`SqlRows::texts`]) per column with its type and default, per
    /// constraint and per index: two inboxes with the same rows, sorted,
    /// have the same schema.
    const DESCRIBE_INBOX_SQL: &'static str;

    /// A new diesel-async connection to this database.
    #[cfg(feature = "async")]
    fn connect_async(&self) -> impl std::future::Future<Output = Self::AsyncConnection> + Send {
        let url = self.url().to_owned();
        async move {
            <Self::AsyncConnection as diesel_async::AsyncConnection>::establish(&url)
                .await
                .expect("connect (async)")
        }
    }

    /// [`open`](Self::open), then a new connection that has run `ddl` (a
    /// suite's effects table): both, or `None` when `open` skips.
    fn open_with_effects(ddl: &str) -> Option<(Self, Self::Connection)> {
        let db = Self::open()?;
        let mut conn = db.connect();
        diesel::connection::SimpleConnection::batch_execute(&mut conn, ddl)
            .expect("create the effects table");
        Some((db, conn))
    }

    /// [`open_with_effects`](Self::open_with_effects) on a new diesel-async
    /// connection.
    #[cfg(feature = "async")]
    fn open_async_with_effects(
        ddl: &str,
    ) -> impl std::future::Future<Output = Option<(Self, Self::AsyncConnection)>> + Send {
        let db = Self::open();
        let ddl = ddl.to_owned();
        async move {
            let db = db?;
            let mut conn = db.connect_async().await;
            diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, &ddl)
                .await
                .expect("create the effects table");
            Some((db, conn))
        }
    }
}

/// What only a database server has, not embedded SQLite: connections with
/// ids that can be listed and ended. Tests bounded by it are instantiated
/// with `backend_tests!(only [postgres, mysql]: …)`.
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use inbox_tests::{Postgres, ServerBackend};
/// assert_eq!(Postgres::kill_sql(42), "SELECT pg_terminate_backend(42, 5000)");
/// # }
/// ```
pub trait ServerBackend: TestBackend {
    /// This connection's id on the server, as a `BIGINT` expression.
    const CONNECTION_ID_SQL: &'static str;

    /// Ends the server connection `id` (on PostgreSQL, waiting up to 5 s
    /// until it is gone).
    fn kill_sql(id: i64) -> String;

    /// Whether the server still lists connection `id`: a `BIGINT`
    /// expression, 0 or 1.
    fn alive_sql(id: i64) -> String;

    /// How many of the connections `ids` wait for the lock of a claim held
    /// by another transaction: a `BIGINT` expression.
    fn lock_waiters_sql(ids: &[i64]) -> String;

    /// The server's port when a URL names none.
    const DEFAULT_PORT: u16;

    /// Whether a duplicate claim locks the row it found until its
    /// transaction ends: MariaDB/MySQL's `INSERT IGNORE` takes a shared lock
    /// on it, PostgreSQL's `ON CONFLICT DO NOTHING` none.
    const DUPLICATE_CLAIM_LOCKS_ROW: bool;

    /// This database's URL, marking the connections made from it with `tag`
    /// where the server can tell connections apart that way (PostgreSQL's
    /// `application_name`); unchanged on MariaDB/MySQL, see
    /// [`tagged_connections_sql`](Self::tagged_connections_sql).
    fn tagged_url(&self, tag: &str) -> String;

    /// The ids (a `BIGINT` column `value`) of the server connections made
    /// from [`tagged_url(tag)`](Self::tagged_url); on MariaDB/MySQL, of every
    /// connection to this database but the caller's.
    fn tagged_connections_sql(&self, tag: &str) -> String;

    /// `url` for a diesel-async connection that must stay on TCP (through a
    /// proxy, say): mysql_async moves a connection to a loopback address
    /// onto the server's Unix socket unless told not to.
    fn async_tcp_url(url: &str) -> String {
        url.to_owned()
    }

    /// A deadpool pool of diesel-async connections.
    #[cfg(feature = "async")]
    type Deadpool: inbox_runtime::background::AsyncPool<Connection = Self::AsyncConnection> + Clone;

    /// A bb8 pool of diesel-async connections.
    #[cfg(feature = "async")]
    type Bb8: inbox_runtime::background::AsyncPool<Connection = Self::AsyncConnection>;

    /// A deadpool pool of at most `size` connections to `url`: this
    /// database's [`url`](TestBackend::url), or a way to it (a proxy, a
    /// [`tagged_url`](Self::tagged_url)).
    #[cfg(feature = "async")]
    fn deadpool(url: &str, size: usize) -> Self::Deadpool {
        Self::deadpool_recycling(
            url,
            size,
            diesel_async::pooled_connection::RecyclingMethod::Verified,
        )
    }

    /// A bb8 pool of at most `size` connections to `url`, with bb8's
    /// defaults (`SELECT 1` on checkout, 30 s to wait for a connection).
    #[cfg(feature = "async")]
    fn bb8(url: &str, size: u32) -> impl std::future::Future<Output = Self::Bb8> + Send {
        Self::bb8_checked(url, size, true, std::time::Duration::from_secs(30))
    }

    /// [`deadpool`](Self::deadpool) with the way it checks a connection
    /// that comes back (`Fast`: only `is_broken`; `Verified`, the default:
    /// also `SELECT 1`).
    #[cfg(feature = "async")]
    fn deadpool_recycling(
        url: &str,
        size: usize,
        recycling: diesel_async::pooled_connection::RecyclingMethod<Self::AsyncConnection>,
    ) -> Self::Deadpool;

    /// [`bb8`](Self::bb8) that runs `SELECT 1` on checkout or not, and
    /// waits at most `timeout` for a connection.
    #[cfg(feature = "async")]
    fn bb8_checked(
        url: &str,
        size: u32,
        test_on_check_out: bool,
        timeout: std::time::Duration,
    ) -> impl std::future::Future<Output = Self::Bb8> + Send;
}

/// [`ServerBackend`]'s pools of the diesel-async connection type `$connection`.
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
macro_rules! async_pools {
    ($connection:ty) => {
        // Expanded in a backend's module, beside `super::async_pools`.
        super::async_pools!(
            $connection,
            diesel_async::pooled_connection::ManagerConfig::default()
        );
    };
    ($connection:ty, $config:expr) => {
        type Deadpool = diesel_async::pooled_connection::deadpool::Pool<$connection>;
        type Bb8 = diesel_async::pooled_connection::bb8::Pool<$connection>;

        fn deadpool_recycling(
            url: &str,
            size: usize,
            recycling: diesel_async::pooled_connection::RecyclingMethod<$connection>,
        ) -> Self::Deadpool {
            use diesel_async::pooled_connection::{
                AsyncDieselConnectionManager, ManagerConfig, deadpool,
            };
            let mut config: ManagerConfig<$connection> = $config;
            config.recycling_method = recycling;
            deadpool::Pool::builder(AsyncDieselConnectionManager::new_with_config(url, config))
                .max_size(size)
                .build()
                .expect("build a deadpool pool")
        }

        fn bb8_checked(
            url: &str,
            size: u32,
            test_on_check_out: bool,
            timeout: std::time::Duration,
        ) -> impl std::future::Future<Output = Self::Bb8> + Send {
            use diesel_async::pooled_connection::{AsyncDieselConnectionManager, bb8};
            let manager = AsyncDieselConnectionManager::new_with_config(url, $config);
            async move {
                bb8::Pool::builder()
                    .max_size(size)
                    .test_on_check_out(test_on_check_out)
                    .connection_timeout(timeout)
                    .build(manager)
                    .await
                    .expect("build a bb8 pool")
            }
        }
    };
}
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
use async_pools;

/// `id, id, …`, for an `IN (…)` list.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn id_list(ids: &[i64]) -> String {
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
