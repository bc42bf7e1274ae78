//! Isolated databases on real servers for tests; see the [crate docs](crate).

/// The environment variable that turns an unreachable server into a failure.
pub const REQUIRE_DATABASES: &str = "INBOX_REQUIRE_DATABASES";

/// A name no other test (in this or a concurrent run) uses (one
/// implementation, shared with the throwaway servers).
pub use inbox_test_servers::unique_name;

/// Whether `INBOX_REQUIRE_DATABASES` asks for every server to be present.
///
/// ```
/// let _required: bool = inbox_suite::testdb::databases_required();
/// ```
pub fn databases_required() -> bool {
    std::env::var(REQUIRE_DATABASES).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// Reports a server that could not be reached: a loud skip, or a panic when
/// servers are required.
fn report_unavailable(backend: &str, url: &str, error: &dyn std::fmt::Display) {
    let message = format!("{backend} is not reachable at {url}: {error}");
    if databases_required() {
        panic!("{message} (and {REQUIRE_DATABASES}=1 requires it)");
    }
    // Written to the stderr handle rather than with `eprintln!`, which the
    // test harness captures (and hides for a passing test): a skip must be
    // seen without `--nocapture`.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr().lock(),
        "skipped: {message}; set {REQUIRE_DATABASES}=1 to make this a failure"
    );
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// One backend's test database, so that a suite can be written once and run
/// against every backend (see `tests/e2e/`).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use inbox_suite::testdb::{SqliteDatabase, TestDatabase};
/// let Some(db) = SqliteDatabase::open() else { return };
/// let _conn = db.connect();
/// assert_eq!(SqliteDatabase::BACKEND, "sqlite");
/// # }
/// ```
pub trait TestDatabase: Sized + Sync {
    /// The backend's connection type.
    type Connection: diesel::r2d2::R2D2Connection + Send + 'static;

    /// A short name for the backend, for test output (`postgres`, `mysql`, `sqlite`).
    const BACKEND: &'static str;

    /// A fresh database with the inbox table, or `None` (after a loud
    /// `skipped:` line) when the server cannot be reached and
    /// `INBOX_REQUIRE_DATABASES` is not set.
    fn open() -> Option<Self>;

    /// A new connection to this database.
    fn connect(&self) -> Self::Connection;

    /// An r2d2 pool of `size` connections to this database.
    fn pool(
        &self,
        size: u32,
    ) -> diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<Self::Connection>>;
}

/// Implements [`TestDatabase`] by forwarding to the inherent methods.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
macro_rules! forward_test_database {
    ($database:ty, $connection:ty, $backend:literal, |$open:ident| $open_expr:expr) => {
        impl TestDatabase for $database {
            type Connection = $connection;
            const BACKEND: &'static str = $backend;

            fn open() -> Option<Self> {
                let $open = <$database>::create;
                $open_expr
            }

            fn connect(&self) -> Self::Connection {
                <$database>::connect(self)
            }

            fn pool(
                &self,
                size: u32,
            ) -> diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<Self::Connection>> {
                <$database>::pool(self, size)
            }
        }
    };
}

#[cfg(feature = "postgres")]
forward_test_database!(PgDatabase, diesel::PgConnection, "postgres", |create| {
    create()
});
#[cfg(feature = "mysql")]
forward_test_database!(MysqlDatabase, diesel::MysqlConnection, "mysql", |create| {
    create()
});
#[cfg(feature = "sqlite")]
forward_test_database!(
    SqliteDatabase,
    diesel::SqliteConnection,
    "sqlite",
    |create| Some(create())
);

#[cfg(feature = "postgres")]
pub use self::postgres::{PgDatabase, PgEncodedDatabase};

#[cfg(feature = "postgres")]
mod postgres {
    use diesel::prelude::*;
    use diesel::r2d2::{ConnectionManager, Pool};

    /// The server at `INBOX_TEST_POSTGRES_URL` (its URL and a connection), or
    /// `None` after a `skipped:` line when it cannot be reached.
    fn admin_connection() -> Option<(String, PgConnection)> {
        let admin_url = super::env_or(
            "INBOX_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        match PgConnection::establish(&admin_url) {
            Ok(conn) => Some((admin_url, conn)),
            Err(error) => {
                super::report_unavailable("PostgreSQL", &admin_url, &error);
                None
            }
        }
    }

    /// A PostgreSQL schema of its own, with the inbox table, dropped on drop.
    /// Every connection made from [`PgDatabase::url`] uses it as its
    /// `search_path`.
    pub struct PgDatabase {
        admin_url: String,
        schema: String,
        url: String,
    }

    impl PgDatabase {
        /// A fresh schema on the server at `INBOX_TEST_POSTGRES_URL`, or
        /// `None` (after a `skipped:` line) when it cannot be reached.
        pub fn create() -> Option<Self> {
            let (admin_url, mut admin) = admin_connection()?;
            let schema = super::unique_name("inbox_test");
            diesel::sql_query(format!("CREATE SCHEMA {schema}"))
                .execute(&mut admin)
                .expect("create the test schema");
            let separator = if admin_url.contains('?') { '&' } else { '?' };
            let url = format!("{admin_url}{separator}options=-csearch_path%3D{schema}");
            let database = PgDatabase {
                admin_url,
                schema,
                url,
            };
            inbox_runtime::setup(&mut database.connect()).expect("create the inbox table");
            Some(database)
        }

        /// The URL of this schema.
        pub fn url(&self) -> &str {
            &self.url
        }

        /// The schema's name.
        pub fn schema(&self) -> &str {
            &self.schema
        }

        /// A new connection to this schema.
        pub fn connect(&self) -> PgConnection {
            PgConnection::establish(&self.url).expect("connect to the test schema")
        }

        /// An r2d2 pool of `size` connections to this schema.
        pub fn pool(&self, size: u32) -> Pool<ConnectionManager<PgConnection>> {
            Pool::builder()
                .max_size(size)
                .build(ConnectionManager::new(self.url.clone()))
                .expect("build a pool")
        }
    }

    /// A PostgreSQL database of its own, created with a server encoding
    /// other than UTF-8 (`ENCODING 'LATIN1'`, say), with the inbox table;
    /// dropped on drop. For what such a server refuses to store.
    pub struct PgEncodedDatabase {
        admin_url: String,
        name: String,
        url: String,
    }

    impl PgEncodedDatabase {
        /// A fresh database with server encoding `encoding` on the server at
        /// `INBOX_TEST_POSTGRES_URL`, or `None` (after a `skipped:` line).
        pub fn create(encoding: &str) -> Option<Self> {
            let (admin_url, mut admin) = admin_connection()?;
            let name = super::unique_name("inbox_enc");
            diesel::sql_query(format!(
                "CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
            ))
            .execute(&mut admin)
            .expect("create the test database");
            let (base, query) = admin_url
                .split_once('?')
                .map_or((admin_url.as_str(), ""), |(b, q)| (b, q));
            let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
            let url = if query.is_empty() {
                format!("{server}/{name}")
            } else {
                format!("{server}/{name}?{query}")
            };
            let database = PgEncodedDatabase {
                admin_url,
                name,
                url,
            };
            inbox_runtime::setup(&mut database.connect()).expect("create the inbox table");
            Some(database)
        }

        /// A new connection to this database.
        pub fn connect(&self) -> PgConnection {
            PgConnection::establish(&self.url).expect("connect to the test database")
        }
    }

    impl Drop for PgEncodedDatabase {
        fn drop(&mut self) {
            if let Ok(mut admin) = PgConnection::establish(&self.admin_url) {
                let _ = diesel::sql_query(format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ))
                .execute(&mut admin);
            }
        }
    }

    impl Drop for PgDatabase {
        fn drop(&mut self) {
            if let Ok(mut admin) = PgConnection::establish(&self.admin_url) {
                let _ = diesel::sql_query(format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
                    .execute(&mut admin);
            }
        }
    }
}

#[cfg(feature = "mysql")]
pub use self::mysql::MysqlDatabase;

#[cfg(feature = "mysql")]
mod mysql {
    use diesel::prelude::*;
    use diesel::r2d2::{ConnectionManager, Pool};

    /// A MariaDB/MySQL database of its own, with the inbox table, dropped on drop.
    pub struct MysqlDatabase {
        admin_url: String,
        name: String,
        url: String,
    }

    impl MysqlDatabase {
        /// A fresh database on the server at `INBOX_TEST_MYSQL_URL`, or `None`
        /// (after a `skipped:` line) when it cannot be reached.
        pub fn create() -> Option<Self> {
            let admin_url =
                super::env_or("INBOX_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
            let mut admin = match MysqlConnection::establish(&admin_url) {
                Ok(conn) => conn,
                Err(error) => {
                    super::report_unavailable("MariaDB/MySQL", &admin_url, &error);
                    return None;
                }
            };
            let name = super::unique_name("inbox_test");
            diesel::sql_query(format!("CREATE DATABASE {name}"))
                .execute(&mut admin)
                .expect("create the test database");
            let server = admin_url
                .rsplit_once('/')
                .map(|(server, _database)| server)
                .expect("a mysql:// URL with a database path");
            let url = format!("{server}/{name}");
            let database = MysqlDatabase {
                admin_url,
                name,
                url,
            };
            inbox_runtime::setup(&mut database.connect()).expect("create the inbox table");
            Some(database)
        }

        /// The URL of this database.
        pub fn url(&self) -> &str {
            &self.url
        }

        /// A new connection to this database.
        pub fn connect(&self) -> MysqlConnection {
            MysqlConnection::establish(&self.url).expect("connect to the test database")
        }

        /// An r2d2 pool of `size` connections to this database.
        pub fn pool(&self, size: u32) -> Pool<ConnectionManager<MysqlConnection>> {
            Pool::builder()
                .max_size(size)
                .build(ConnectionManager::new(self.url.clone()))
                .expect("build a pool")
        }
    }

    impl Drop for MysqlDatabase {
        fn drop(&mut self) {
            if let Ok(mut admin) = MysqlConnection::establish(&self.admin_url) {
                let _ = diesel::sql_query(format!("DROP DATABASE IF EXISTS {}", self.name))
                    .execute(&mut admin);
            }
        }
    }
}

#[cfg(feature = "sqlite")]
pub use self::sqlite::SqliteDatabase;

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::path::PathBuf;

    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool};

    /// A SQLite database file of its own (WAL mode, 10 s busy timeout), with
    /// the inbox table, deleted on drop.
    pub struct SqliteDatabase {
        path: PathBuf,
    }

    const PRAGMAS: &str =
        "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;";

    impl SqliteDatabase {
        /// A fresh database file in the temporary directory. SQLite is
        /// embedded, so this never skips.
        pub fn create() -> Self {
            let path =
                std::env::temp_dir().join(format!("{}.sqlite3", super::unique_name("inbox_test")));
            let database = SqliteDatabase { path };
            inbox_runtime::setup(&mut database.connect()).expect("create the inbox table");
            database
        }

        /// The database file's path as a URL Diesel accepts.
        pub fn url(&self) -> String {
            self.path.display().to_string()
        }

        /// A new connection, with the busy timeout set.
        pub fn connect(&self) -> SqliteConnection {
            let mut conn =
                SqliteConnection::establish(&self.url()).expect("open the test database");
            conn.batch_execute(PRAGMAS).expect("set SQLite pragmas");
            conn
        }

        /// An r2d2 pool of `size` connections, each with the busy timeout set.
        pub fn pool(&self, size: u32) -> Pool<ConnectionManager<SqliteConnection>> {
            Pool::builder()
                .max_size(size)
                .connection_customizer(Box::new(Pragmas))
                .build(ConnectionManager::new(self.url()))
                .expect("build a pool")
        }
    }

    #[derive(Debug)]
    struct Pragmas;

    impl CustomizeConnection<SqliteConnection, diesel::r2d2::Error> for Pragmas {
        fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), diesel::r2d2::Error> {
            conn.batch_execute(PRAGMAS)
                .map_err(diesel::r2d2::Error::QueryError)
        }
    }

    impl Drop for SqliteDatabase {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let mut file = self.path.clone().into_os_string();
                file.push(suffix);
                let _ = std::fs::remove_file(file);
            }
        }
    }
}

#[cfg(feature = "postgres")]
pub use self::throwaway::PgServer;

#[cfg(feature = "postgres")]
mod throwaway {
    /// A PostgreSQL server of a test's own, for the faults a test must not
    /// inflict on the shared server (an immediate restart, a read-only
    /// setting): [`inbox_test_servers::PgServer::start`] (`initdb` into a
    /// fresh temporary directory, trust authentication on 127.0.0.1 only, a
    /// free port, superuser `postgres`, database `postgres`), whose methods
    /// it offers (`Deref`). Stopped (immediate mode) and removed on drop.
    ///
    /// The binaries come from `INBOX_TEST_PG_BIN`, else the newest
    /// `/usr/lib/postgresql/<version>/bin`. Run as root, they run as the
    /// `postgres` OS user (`runuser`).
    ///
    /// ```no_run
    /// use diesel::prelude::*;
    /// use inbox_suite::testdb::PgServer;
    ///
    /// let Some(server) = PgServer::start() else { return Ok(()) }; // `skipped:` printed
    /// let mut conn = PgConnection::establish(&server.url())?;
    /// server.restart_immediate(); // every connection to it is now dead
    /// assert!(diesel::sql_query("SELECT 1").execute(&mut conn).is_err());
    /// let mut conn = PgConnection::establish(&server.url())?; // the restarted server
    /// server.set_read_only(true); // new transactions fail with 25006
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub struct PgServer(inbox_test_servers::PgServer);

    impl PgServer {
        /// Creates and starts a server, or returns `None` after a loud
        /// `skipped:` line when it cannot (no binaries, `initdb` or start
        /// failed); with `INBOX_REQUIRE_DATABASES=1` that panics instead.
        pub fn start() -> Option<Self> {
            match inbox_test_servers::PgServer::start() {
                Ok(server) => Some(PgServer(server)),
                Err(error) => {
                    super::report_unavailable("a throwaway PostgreSQL server", "127.0.0.1", &error);
                    None
                }
            }
        }
    }

    impl std::ops::Deref for PgServer {
        type Target = inbox_test_servers::PgServer;

        fn deref(&self) -> &Self::Target {
            &self.0
        }
    }
}

#[cfg(feature = "mysql")]
pub use self::galera::GaleraCluster;

/// A throwaway 3-node MariaDB Galera cluster on loopback, with the inbox table.
#[cfg(feature = "mysql")]
pub mod galera {
    use std::time::Instant;

    use diesel::prelude::*;

    pub use inbox_test_servers::galera::{DATABASE, NODES};

    /// A 3-node MariaDB Galera cluster of a test's own, on 127.0.0.1: never
    /// the shared server. [`inbox_test_servers::GaleraCluster::start`]
    /// (its own data directories, ports, provider settings and short
    /// group-communication timeouts; root over TCP with an empty password),
    /// whose methods it offers (`Deref`), with the inbox table in
    /// [`DATABASE`] on every node.
    ///
    /// [`GaleraCluster::start`] returns once `wsrep_cluster_size = 3` and
    /// every node says `wsrep_ready = ON`; every node is killed and the
    /// directory removed on drop. Needs Debian's `mariadb-server`,
    /// `galera-4` and `rsync`; where they are missing or the cluster does
    /// not form, `start` prints the harness's `skipped:` line (a failure
    /// under `INBOX_REQUIRE_DATABASES=1`).
    ///
    /// ```no_run
    /// use diesel::prelude::*;
    /// use inbox_suite::testdb::GaleraCluster;
    ///
    /// let Some(cluster) = GaleraCluster::start() else { return Ok(()) }; // `skipped:` printed
    /// let mut conn = MysqlConnection::establish(&cluster.url(1))?;
    /// cluster.kill(2); // SIGKILL: the other two carry on
    /// cluster.restart(2); // rejoins (state transfer), back to 3 nodes
    /// assert_eq!(cluster.status(0, "wsrep_cluster_size").as_deref(), Some("3"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub struct GaleraCluster(inbox_test_servers::GaleraCluster);

    impl GaleraCluster {
        /// Creates and starts the cluster with the inbox table, or returns
        /// `None` after a loud `skipped:` line when it cannot (binaries
        /// missing, a node that does not start or join); with
        /// `INBOX_REQUIRE_DATABASES=1` that panics.
        pub fn start() -> Option<Self> {
            let started = Instant::now();
            match Self::try_start() {
                Ok(cluster) => {
                    use std::io::Write as _;
                    let _ = writeln!(
                        std::io::stderr().lock(),
                        "galera: 3-node cluster on ports {:?} ready in {:.1} s",
                        (0..NODES).map(|n| cluster.port(n)).collect::<Vec<_>>(),
                        started.elapsed().as_secs_f64()
                    );
                    Some(cluster)
                }
                Err(error) => {
                    super::report_unavailable(
                        "a throwaway MariaDB Galera cluster",
                        "127.0.0.1",
                        &error,
                    );
                    None
                }
            }
        }

        fn try_start() -> Result<Self, String> {
            let cluster = GaleraCluster(inbox_test_servers::GaleraCluster::start()?);
            let url = cluster.url(0);
            let mut conn = MysqlConnection::establish(&url).map_err(|e| format!("{url}: {e}"))?;
            inbox_runtime::setup(&mut conn).map_err(|e| format!("create the inbox table: {e}"))?;
            Ok(cluster)
        }
    }

    impl std::ops::Deref for GaleraCluster {
        type Target = inbox_test_servers::GaleraCluster;

        fn deref(&self) -> &Self::Target {
            &self.0
        }
    }
}
