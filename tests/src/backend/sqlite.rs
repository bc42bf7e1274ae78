//! SQLite: a database file of a test's own, and SQLite's SQL for the tests.

use std::path::PathBuf;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool};

use super::TestBackend;

/// A SQLite database file of its own (WAL mode, 10 s busy timeout), with
/// the inbox table, deleted on drop. SQLite is embedded: it never skips.
///
/// ```
/// use inbox_tests::{Sqlite, TestBackend};
///
/// let db = Sqlite::open().expect("SQLite is embedded");
/// let _conn = db.connect();
/// assert_eq!(Sqlite::NAME, "sqlite");
/// ```
pub struct Sqlite {
    path: PathBuf,
    url: String,
}

const PRAGMAS: &str =
    "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;";

impl TestBackend for Sqlite {
    type Connection = SqliteConnection;
    #[cfg(feature = "async")]
    type AsyncConnection =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<SqliteConnection>;

    const NAME: &'static str = "sqlite";
    const FAILED_STATEMENT_ABORTS_TRANSACTION: bool = false;
    const RECEIVED_AGE_MICROS_SQL: &'static str =
        "CAST(ROUND((julianday('now') - julianday(received_at)) * 86400000000.0) AS INTEGER)";
    const EXACT_TEXT_TYPE: &'static str = "TEXT";
    const RACE_THREADS: usize = 8;
    const ROLLBACK_STORMS_MAY_OUTLAST_CLAIM_RETRIES: bool = false;

    /// A fresh database file in the temporary directory.
    fn open() -> Option<Self> {
        let path =
            std::env::temp_dir().join(format!("{}.sqlite3", crate::unique_name("inbox_test")));
        let url = path.display().to_string();
        let database = Sqlite { path, url };
        inbox_runtime::setup(&mut database.connect()).expect("create the inbox table");
        Some(database)
    }

    fn url(&self) -> &str {
        &self.url
    }

    /// A new connection, with the busy timeout set.
    fn connect(&self) -> SqliteConnection {
        let mut conn = SqliteConnection::establish(&self.url).expect("open the test database");
        conn.batch_execute(PRAGMAS).expect("set SQLite pragmas");
        conn
    }

    /// A new diesel-async connection: [`connect`](Self::connect)'s,
    /// wrapped, the busy timeout set as on every other.
    #[cfg(feature = "async")]
    fn connect_async(&self) -> impl std::future::Future<Output = Self::AsyncConnection> + Send {
        let conn = self.connect();
        async move { diesel_async::sync_connection_wrapper::SyncConnectionWrapper::new(conn) }
    }

    /// An r2d2 pool of `size` connections, each with the busy timeout set.
    fn pool(&self, size: u32) -> Pool<ConnectionManager<SqliteConnection>> {
        Pool::builder()
            .max_size(size)
            .connection_customizer(Box::new(Pragmas))
            .build(ConnectionManager::new(self.url.clone()))
            .expect("build a pool")
    }

    fn ago_sql(seconds: i64) -> String {
        format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '-{seconds} seconds')")
    }

    const FIRST_SCHEMA_SQL: &'static str = include_str!(
        "../../../inbox-runtime/migrations/sqlite/2026-12-01-000000_create_inbox_messages/up.sql"
    );

    /// A table renamed by the migration's rebuild is stored with its name
    /// quoted.
    const DESCRIBE_INBOX_SQL: &'static str = "SELECT type || ' ' || name || ': ' || replace(sql, '\"inbox_messages\"', 'inbox_messages') AS value \
         FROM sqlite_master WHERE tbl_name = 'inbox_messages'";
}

#[derive(Debug)]
struct Pragmas;

impl CustomizeConnection<SqliteConnection, diesel::r2d2::Error> for Pragmas {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), diesel::r2d2::Error> {
        conn.batch_execute(PRAGMAS)
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut file = self.path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
}
