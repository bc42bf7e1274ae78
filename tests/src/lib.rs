//! The test harness of the inbox workspace: a database of a test's own on a
//! real server, and one way to run a test against every backend.
//!
//! A [`TestBackend`] hands each test a fresh PostgreSQL schema
//! ([`Postgres`]), MariaDB/MySQL database ([`Mysql`]) or SQLite file
//! ([`Sqlite`]) with the inbox table, and knows what differs between the
//! backends; a test body is an ordinary generic function over it, and
//! [`backend_tests!`] instantiates it per backend. Server URLs come from
//! `INBOX_TEST_POSTGRES_URL` and `INBOX_TEST_MYSQL_URL`, defaulting to the
//! local servers (`postgres://postgres@127.0.0.1:5432/test`,
//! `mysql://root@127.0.0.1:3306/test`). When a server cannot be reached the
//! test prints a `skipped:` line and passes, unless
//! `INBOX_REQUIRE_DATABASES=1`, which turns the skip into a failure.
//!
//! Faults a test must not inflict on the shared servers run on servers of
//! its own: [`PgServer`] (PostgreSQL) and [`GaleraCluster`] (a 3-node
//! MariaDB Galera cluster).
//!
//! The chaos tests on real brokers (feature `brokers`, `tests/brokers/`)
//! need RabbitMQ and NATS with JetStream: an unreachable broker is a loud
//! skip, or a failure with `INBOX_TEST_REQUIRE_BROKERS=1` (which `cargo
//! xtask test` sets). Their consumer processes are the `chaos-consumer`
//! binary.
//!
//! The suites are in `tests/<suite>/`; [`AppError`] is the application error
//! type their handlers return.

mod app_error;
#[cfg(feature = "async")]
mod async_rows;
mod backend;
#[cfg(feature = "async")]
mod cancel;
mod connections;
mod deferred;
mod depth;
pub mod failure_rows;
pub mod guide;
mod macros;
mod migrated;
mod panics;
pub mod proxy;
mod rows;
#[cfg(feature = "async")]
pub mod runtime;
mod sent;
mod statement;

pub use self::app_error::AppError;
#[cfg(feature = "async")]
pub use self::async_rows::AsyncSqlRows;
#[cfg(feature = "mysql")]
pub use self::backend::Mysql;
#[cfg(feature = "sqlite")]
pub use self::backend::Sqlite;
pub use self::backend::{DieselBackend, ServerBackend, TestBackend};
#[cfg(feature = "postgres")]
pub use self::backend::{
    NoStatementCache, PgEncodedDatabase, Postgres, behind_pgbouncer, skipped_behind_pgbouncer,
};
#[cfg(feature = "async")]
pub use self::cancel::CancelAfter;
pub use self::connections::{connection_id, terminate};
#[cfg(feature = "async")]
pub use self::connections::{connection_id_async, terminate_async};
pub use self::deferred::{COUNT_CHILDREN_SQL, ORPHAN_SQL, create_deferred_foreign_key};
pub use self::depth::transaction_depth;
#[cfg(feature = "async")]
pub use self::depth::transaction_depth_async;
pub use self::migrated::{inbox_migrations_since, migrate_inbox_before};
pub use self::panics::{panic_text, quiet_deliberate_panics};
pub use self::rows::SqlRows;
pub use self::sent::{mysql_commands, mysql_commands_of, statement_shapes, statements_of};
#[cfg(feature = "async")]
pub use self::sent::{mysql_commands_async, mysql_commands_of_async};
pub use self::statement::{Statement, statement};

/// The environment variable that turns an unreachable server into a failure.
pub const REQUIRE_DATABASES: &str = "INBOX_REQUIRE_DATABASES";

/// A name no other test (in this or a concurrent run) uses (one
/// implementation, shared with the throwaway servers).
pub use inbox_test_servers::unique_name;

/// Whether `INBOX_REQUIRE_DATABASES` asks for every server to be present.
///
/// ```
/// let _required: bool = inbox_tests::databases_required();
/// ```
pub fn databases_required() -> bool {
    std::env::var(REQUIRE_DATABASES).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// The environment variable that turns an unreachable broker (RabbitMQ,
/// NATS) into a failure of the chaos tests.
pub const REQUIRE_BROKERS: &str = "INBOX_TEST_REQUIRE_BROKERS";

/// Whether `INBOX_TEST_REQUIRE_BROKERS` asks for every broker to be present.
///
/// ```
/// let _required: bool = inbox_tests::brokers_required();
/// ```
pub fn brokers_required() -> bool {
    std::env::var(REQUIRE_BROKERS).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Reports a broker that could not be reached: a loud `skipped:` line, or a
/// panic when `INBOX_TEST_REQUIRE_BROKERS=1`.
///
/// ```no_run
/// inbox_tests::report_unavailable_broker("RabbitMQ", "amqp://127.0.0.1:5672", &"connection refused");
/// ```
pub fn report_unavailable_broker(broker: &str, url: &str, error: &dyn std::fmt::Display) {
    let message = format!("{broker} is not reachable at {}: {error}", redacted(url));
    if brokers_required() {
        panic!("{message} (and {REQUIRE_BROKERS}=1 requires it)");
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr().lock(),
        "skipped: {message}; set {REQUIRE_BROKERS}=1 to make this a failure"
    );
}

/// `url` with the password of its user info, if any, replaced by `***`.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((user_info, _)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***{}", &rest[user_info.len()..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            super::redacted("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            super::redacted("nats://127.0.0.1:4222"),
            "nats://127.0.0.1:4222"
        );
    }
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

#[cfg(feature = "postgres")]
pub use self::throwaway::{PgFormation, PgServer, PoolMode, Replication};

#[cfg(feature = "postgres")]
mod throwaway {
    pub use inbox_test_servers::{PoolMode, Replication};

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
    /// use inbox_tests::PgServer;
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

        /// PgBouncer in front of this server
        /// ([`inbox_test_servers::PgBouncer::start`]), in `mode`, with at
        /// most `pool_size` server connections per database, or `None` after
        /// a loud `skipped:` line when it cannot start (no `pgbouncer`); with
        /// `INBOX_REQUIRE_DATABASES=1` that panics instead.
        ///
        /// ```no_run
        /// use inbox_tests::{PgServer, PoolMode};
        ///
        /// let Some(server) = PgServer::start() else { return };
        /// let Some(bouncer) = server.pgbouncer(PoolMode::Transaction, 2) else { return };
        /// println!("{}", bouncer.url_of("postgres"));
        /// ```
        pub fn pgbouncer(
            &self,
            mode: PoolMode,
            pool_size: u32,
        ) -> Option<inbox_test_servers::PgBouncer> {
            match inbox_test_servers::PgBouncer::start(&self.0, mode, pool_size) {
                Ok(bouncer) => Some(bouncer),
                Err(error) => {
                    super::report_unavailable("a throwaway PgBouncer", "127.0.0.1", &error);
                    None
                }
            }
        }

        /// A streaming standby of this server
        /// ([`inbox_test_servers::PgServer::start_standby`]), or `None` after
        /// a loud `skipped:` line when it cannot be made (no
        /// `pg_basebackup`, no streaming within 30 s); with
        /// `INBOX_REQUIRE_DATABASES=1` that panics instead.
        ///
        /// ```no_run
        /// use inbox_tests::{PgServer, Replication};
        ///
        /// let Some(primary) = PgServer::start() else { return };
        /// let Some(standby) = primary.start_standby(Replication::Synchronous) else { return };
        /// primary.stop_immediate();
        /// standby.promote(); // every commit the primary acknowledged is here
        /// ```
        pub fn start_standby(&self, replication: Replication) -> Option<Self> {
            match self.0.start_standby(replication) {
                Ok(server) => Some(PgServer(server)),
                Err(error) => {
                    super::report_unavailable(
                        "a streaming standby of a throwaway PostgreSQL server",
                        "127.0.0.1",
                        &error,
                    );
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

    /// A pg_auto_failover formation of a test's own
    /// ([`inbox_test_servers::PgFormation::start`]: a monitor and a
    /// synchronous primary/secondary pair on 127.0.0.1 that fails over by
    /// itself), whose methods it offers (`Deref`). Every keeper and server
    /// is killed and the directory removed on drop.
    ///
    /// ```no_run
    /// use inbox_tests::PgFormation;
    ///
    /// let Some(formation) = PgFormation::start() else { return Ok(()) }; // `skipped:` printed
    /// let primary = formation.primary()?;
    /// formation.kill_node(primary);
    /// formation.wait_for_primary_other_than(primary)?;
    /// # Ok::<(), String>(())
    /// ```
    pub struct PgFormation(inbox_test_servers::PgFormation);

    impl PgFormation {
        /// Creates and starts the formation, or returns `None` after a loud
        /// `skipped:` line when it cannot (no `pg_autoctl`, a node that does
        /// not reach its state); with `INBOX_REQUIRE_DATABASES=1` that
        /// panics instead.
        pub fn start() -> Option<Self> {
            match inbox_test_servers::PgFormation::start() {
                Ok(formation) => Some(PgFormation(formation)),
                Err(error) => {
                    super::report_unavailable(
                        "a throwaway pg_auto_failover formation",
                        "127.0.0.1",
                        &error,
                    );
                    None
                }
            }
        }
    }

    impl std::ops::Deref for PgFormation {
        type Target = inbox_test_servers::PgFormation;

        fn deref(&self) -> &Self::Target {
            &self.0
        }
    }
}

#[cfg(feature = "mysql")]
pub use self::galera::{GaleraCluster, HaProxy};

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
    /// use inbox_tests::GaleraCluster;
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

        /// The cluster, once the inbox table is created on it. Nodes that
        /// have just joined can still refuse the schema's statements for a
        /// moment on a loaded machine: the setup is tried again, a second
        /// apart and on a new connection, [`SETUP_TRIES`] times at most, and
        /// its last error is reported with its causes.
        fn try_start() -> Result<Self, String> {
            let cluster = GaleraCluster(inbox_test_servers::GaleraCluster::start()?);
            let url = cluster.url(0);
            let mut tries = 0;
            loop {
                let set_up = MysqlConnection::establish(&url)
                    .map_err(|e| format!("{url}: {e}"))
                    .and_then(|mut conn| {
                        inbox_runtime::setup(&mut conn)
                            .map_err(|e| format!("create the inbox table: {}", with_causes(&e)))
                    });
                tries += 1;
                match set_up {
                    Ok(()) => return Ok(cluster),
                    Err(error) if tries >= SETUP_TRIES => return Err(error),
                    Err(_) => std::thread::sleep(std::time::Duration::from_secs(1)),
                }
            }
        }
    }

    /// How many times the cluster's schema is tried, a second apart.
    const SETUP_TRIES: u32 = 20;

    /// `error` and its causes, `: `-separated.
    fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
        let mut text = error.to_string();
        let mut cause = error.source();
        while let Some(next) = cause {
            text.push_str(": ");
            text.push_str(&next.to_string());
            cause = next.source();
        }
        text
    }

    impl std::ops::Deref for GaleraCluster {
        type Target = inbox_test_servers::GaleraCluster;

        fn deref(&self) -> &Self::Target {
            &self.0
        }
    }

    /// HAProxy of a test's own ([`inbox_test_servers::HaProxy::start`]: TCP
    /// mode on a free port of 127.0.0.1, every connection to the first of
    /// the given ports while its check passes, the others as backups), or
    /// `None` after a loud `skipped:` line when it cannot start (no
    /// `haproxy`); with `INBOX_REQUIRE_DATABASES=1` that panics instead.
    /// Killed and removed on drop.
    ///
    /// ```no_run
    /// use inbox_tests::{GaleraCluster, HaProxy};
    ///
    /// let Some(cluster) = GaleraCluster::start() else { return };
    /// let Some(proxy) = HaProxy::start(&[cluster.port(0), cluster.port(1)]) else { return };
    /// println!("mysql://root@127.0.0.1:{}/{}", proxy.port(), inbox_tests::galera::DATABASE);
    /// ```
    pub struct HaProxy(inbox_test_servers::HaProxy);

    impl HaProxy {
        /// Starts HAProxy in front of `servers` (ports on 127.0.0.1, the
        /// first active), or `None` after a loud `skipped:` line.
        pub fn start(servers: &[u16]) -> Option<Self> {
            match inbox_test_servers::HaProxy::start(servers) {
                Ok(proxy) => Some(HaProxy(proxy)),
                Err(error) => {
                    crate::report_unavailable("a throwaway HAProxy", "127.0.0.1", &error);
                    None
                }
            }
        }
    }

    impl std::ops::Deref for HaProxy {
        type Target = inbox_test_servers::HaProxy;

        fn deref(&self) -> &Self::Target {
            &self.0
        }
    }
}
