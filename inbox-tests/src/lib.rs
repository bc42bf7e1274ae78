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
//! The suites are in `tests/<suite>/`; [`AppError`] is the application error
//! type their handlers return.

mod app_error;
#[cfg(feature = "async")]
mod async_rows;
mod backend;
mod connections;
mod macros;
mod rows;
#[cfg(feature = "async")]
pub mod runtime;
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
pub use self::backend::{PgEncodedDatabase, Postgres};
pub use self::connections::{connection_id, terminate};
#[cfg(feature = "async")]
pub use self::connections::{connection_id_async, terminate_async};
pub use self::rows::SqlRows;
pub use self::statement::{statement, Statement};

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable that turns an unreachable server into a failure.
pub const REQUIRE_DATABASES: &str = "INBOX_REQUIRE_DATABASES";

/// A name no other test (in this or a concurrent run) uses.
///
/// ```
/// let a = inbox_tests::unique_name("t");
/// let b = inbox_tests::unique_name("t");
/// assert_ne!(a, b);
/// assert!(a.starts_with("t_"));
/// ```
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether `INBOX_REQUIRE_DATABASES` asks for every server to be present.
///
/// ```
/// let _required: bool = inbox_tests::databases_required();
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

/// Whether this process runs as root (the throwaway servers then run as
/// their own system user, as their binaries require).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `count` distinct ports nobody listens on now, for the throwaway servers
/// (the OS picks them; all are held until all are picked, then released).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn free_ports(count: usize) -> Result<Vec<u16>, String> {
    let listeners = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("find a free port: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("find a free port: {e}"))
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[cfg(feature = "postgres")]
pub use self::throwaway::PgServer;

#[cfg(feature = "postgres")]
mod throwaway {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use diesel::prelude::*;

    /// A PostgreSQL server of a test's own, for the faults a test must not
    /// inflict on the shared server (an immediate restart, a read-only
    /// setting): `initdb` into a fresh temporary directory, trust
    /// authentication on 127.0.0.1 only, a free port, superuser `postgres`,
    /// database `postgres`. Stopped (immediate mode) and removed on drop.
    ///
    /// The binaries come from `INBOX_TEST_PG_BIN`, else the newest
    /// `/usr/lib/postgresql/<version>/bin`. Run as root, they run as the
    /// `postgres` OS user (`runuser`). `fsync` is off: only the server's
    /// processes ever die here, never the machine, so a commit written to
    /// the kernel survives an immediate stop (`synchronous_commit` stays
    /// on).
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
    pub struct PgServer {
        bin: PathBuf,
        dir: PathBuf,
        port: u16,
        as_postgres: bool,
    }

    impl PgServer {
        /// Creates and starts a server, or returns `None` after a loud
        /// `skipped:` line when it cannot (no binaries, `initdb` or start
        /// failed); with `INBOX_REQUIRE_DATABASES=1` that panics instead.
        pub fn start() -> Option<Self> {
            let bin = match bin_dir() {
                Ok(bin) => bin,
                Err(error) => {
                    super::report_unavailable("a throwaway PostgreSQL server", "(none)", &error);
                    return None;
                }
            };
            // A port taken over between `free_port` and the start: try another.
            let mut last_error = String::new();
            for _ in 0..3 {
                match Self::try_start(&bin) {
                    Ok(server) => return Some(server),
                    Err(error) => last_error = error,
                }
            }
            super::report_unavailable(
                "a throwaway PostgreSQL server",
                &bin.display().to_string(),
                &last_error,
            );
            None
        }

        fn try_start(bin: &Path) -> Result<Self, String> {
            let as_postgres = super::running_as_root();
            let dir = std::env::temp_dir().join(super::unique_name("inbox_pg"));
            std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            let port = super::free_ports(1)?[0];
            // Dropped (stopped and removed) on every early return below.
            let server = PgServer {
                bin: bin.to_owned(),
                dir,
                port,
                as_postgres,
            };
            if as_postgres {
                server.run(
                    Command::new("chown")
                        .args(["postgres:postgres"])
                        .arg(&server.dir),
                )?;
            }
            let data = server.data_dir();
            server.run(
                server
                    .command("initdb")
                    .arg("-D")
                    .arg(&data)
                    .args(["-U", "postgres", "-A", "trust", "-E", "UTF8"])
                    .args(["--locale=C", "--no-sync"]),
            )?;
            let settings = format!(
                "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
                 fsync = off\nmax_connections = 40\nshared_buffers = 16MB\n",
                server.dir.display()
            );
            let conf = data.join("postgresql.conf");
            let mut text = std::fs::read_to_string(&conf).map_err(|e| e.to_string())?;
            text.push_str(&settings);
            std::fs::write(&conf, text).map_err(|e| e.to_string())?;
            server.pg_ctl(&["start"])?;
            Ok(server)
        }

        /// The server's port on 127.0.0.1.
        pub fn port(&self) -> u16 {
            self.port
        }

        /// `127.0.0.1:<port>`, for a multi-host URL.
        pub fn host_port(&self) -> String {
            format!("127.0.0.1:{}", self.port)
        }

        /// `postgres://postgres@127.0.0.1:<port>/postgres`.
        pub fn url(&self) -> String {
            format!("postgres://postgres@{}/postgres", self.host_port())
        }

        /// Stops the server in immediate mode (every backend is killed, no
        /// checkpoint: crash recovery at the next start) and starts it again
        /// on the same port; returns once it accepts connections.
        ///
        /// # Panics
        /// When `pg_ctl` fails.
        pub fn restart_immediate(&self) {
            self.pg_ctl(&["restart", "-m", "immediate"])
                .expect("restart the throwaway server");
        }

        /// Stops the server in immediate mode; [`PgServer::resume`] starts it again.
        ///
        /// # Panics
        /// When `pg_ctl` fails.
        pub fn stop_immediate(&self) {
            self.pg_ctl(&["stop", "-m", "immediate"])
                .expect("stop the throwaway server");
        }

        /// Starts a server stopped with [`PgServer::stop_immediate`].
        ///
        /// # Panics
        /// When `pg_ctl` fails.
        pub fn resume(&self) {
            self.pg_ctl(&["start"]).expect("start the throwaway server");
        }

        /// Turns `default_transaction_read_only` on or off (`ALTER SYSTEM` and
        /// a configuration reload), and returns once new sessions see it.
        /// Once on, a new session's transactions fail to write with
        /// SQLSTATE 25006 `read_only_sql_transaction`, as on a standby, and a
        /// `target_session_attrs=read-write` connection skips the server.
        /// A session already open applies the reload after its next
        /// statement (PostgreSQL reads the configuration between commands).
        ///
        /// # Panics
        /// When the server cannot be reached, or new sessions do not see
        /// the setting within 10 s.
        pub fn set_read_only(&self, on: bool) {
            let mut conn =
                PgConnection::establish(&self.url()).expect("connect to change the setting");
            let value = if on { "on" } else { "off" };
            diesel::sql_query(format!(
                "ALTER SYSTEM SET default_transaction_read_only = {value}"
            ))
            .execute(&mut conn)
            .expect("ALTER SYSTEM");
            diesel::sql_query("SELECT pg_reload_conf()")
                .execute(&mut conn)
                .expect("reload the configuration");
            // The postmaster reloads on the signal, asynchronously.
            let started = std::time::Instant::now();
            loop {
                let mut fresh = PgConnection::establish(&self.url()).expect("connect to check");
                let seen: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
                    "current_setting('default_transaction_read_only')",
                ))
                .get_result(&mut fresh)
                .expect("read the setting");
                if seen == value {
                    return;
                }
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(10),
                    "new sessions still see default_transaction_read_only = {seen}"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }

        fn data_dir(&self) -> PathBuf {
            self.dir.join("data")
        }

        /// `pg_ctl <args>`, waiting for it (`-w`), logging to the server's log file.
        fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
            self.run(
                self.command("pg_ctl")
                    .arg("-D")
                    .arg(self.data_dir())
                    .arg("-l")
                    .arg(self.dir.join("server.log"))
                    .args(["-w", "-t", "60"])
                    .args(args),
            )
        }

        /// One of the server's binaries, as the `postgres` OS user when run as root.
        fn command(&self, program: &str) -> Command {
            let program = self.bin.join(program);
            if self.as_postgres {
                let mut command = Command::new("runuser");
                command.args(["-u", "postgres", "--"]).arg(program);
                command
            } else {
                Command::new(program)
            }
        }

        fn run(&self, command: &mut Command) -> Result<(), String> {
            let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
            if output.status.success() {
                Ok(())
            } else {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                Err(format!(
                    "{command:?}: {}\n{}{}\n{log}",
                    output.status,
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ))
            }
        }
    }

    impl Drop for PgServer {
        fn drop(&mut self) {
            if self.data_dir().join("postmaster.pid").exists() {
                let _ = self.pg_ctl(&["stop", "-m", "immediate"]);
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// `INBOX_TEST_PG_BIN`, else the newest `/usr/lib/postgresql/<version>/bin` with an `initdb`.
    fn bin_dir() -> Result<PathBuf, String> {
        if let Ok(dir) = std::env::var("INBOX_TEST_PG_BIN") {
            return Ok(PathBuf::from(dir));
        }
        let root = Path::new("/usr/lib/postgresql");
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
            .map_err(|e| format!("no PostgreSQL binaries under {}: {e}", root.display()))?
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let version = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                bin.join("initdb").exists().then_some((version, bin))
            })
            .collect();
        versions.sort();
        versions
            .pop()
            .map(|(_, bin)| bin)
            .ok_or_else(|| format!("no initdb under {}/<version>/bin", root.display()))
    }
}

#[cfg(feature = "mysql")]
pub use self::galera::GaleraCluster;

/// A throwaway 3-node MariaDB Galera cluster on loopback.
#[cfg(feature = "mysql")]
pub mod galera {
    use std::fmt::Write as _;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use diesel::prelude::*;
    use diesel::sql_types::Text;

    /// The number of nodes of a [`GaleraCluster`].
    pub const NODES: usize = 3;

    /// The database every node serves, with the inbox table.
    pub const DATABASE: &str = "inbox_galera";

    const MARIADBD: &str = "/usr/sbin/mariadbd";
    const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";
    /// How long a node may take to start (a joiner includes its state transfer).
    const START_TIMEOUT: Duration = Duration::from_secs(120);

    /// A 3-node MariaDB Galera cluster of a test's own, on 127.0.0.1: never
    /// the shared server on 3306. Each node has its own data directory in a
    /// fresh temporary directory (`mariadb-install-db` for the first node;
    /// the others receive it by `rsync` state transfer), its own SQL,
    /// group-communication, IST and SST ports (free ports the OS picks),
    /// `wsrep_provider=/usr/lib/galera/libgalera_smm.so`, `binlog_format=ROW`,
    /// `innodb_autoinc_lock_mode=2`; the first node bootstraps the cluster
    /// (`--wsrep-new-cluster`). Root over TCP with an empty password;
    /// database [`DATABASE`] with the inbox table on every node.
    ///
    /// Small and quick: a 32 MB buffer pool, an 8 MB redo log, a 16 MB
    /// gcache, no performance schema, `innodb_flush_log_at_trx_commit=0`
    /// (only the server processes die here, never the machine), and short
    /// group-communication timeouts so that a killed node leaves the view in
    /// about 3 s instead of the default 5–15 s. Run as root, the servers run
    /// as the `mysql` OS user (the rsync daemon of a state transfer cannot
    /// write as root's `nobody`).
    ///
    /// Started by [`GaleraCluster::start`], which returns once
    /// `wsrep_cluster_size = 3` and every node says `wsrep_ready = ON`;
    /// every node is killed and the directory removed on drop. Needs Debian's
    /// `mariadb-server`, `galera-4` and `rsync`; where they are missing or
    /// the cluster does not form, `start` prints the harness's `skipped:`
    /// line (a failure under `INBOX_REQUIRE_DATABASES=1`).
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
    pub struct GaleraCluster {
        dir: PathBuf,
        nodes: Vec<Node>,
        as_mysql: bool,
    }

    struct Node {
        sql: u16,
        gcomm: u16,
        ist: u16,
        sst: u16,
        process: std::sync::Mutex<Option<Child>>,
    }

    #[derive(QueryableByName)]
    struct Value {
        #[diesel(sql_type = Text)]
        value: String,
    }

    impl GaleraCluster {
        /// Creates and starts the cluster, or returns `None` after a loud
        /// `skipped:` line when it cannot (binaries missing, a node that does
        /// not start or join); with `INBOX_REQUIRE_DATABASES=1` that panics.
        pub fn start() -> Option<Self> {
            let started = Instant::now();
            match missing_binaries().and_then(|()| Self::try_start()) {
                Ok(cluster) => {
                    use std::io::Write as _;
                    let _ = writeln!(
                        std::io::stderr().lock(),
                        "galera: 3-node cluster on ports {:?} ready in {:.1} s",
                        cluster.nodes.iter().map(|n| n.sql).collect::<Vec<_>>(),
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
            let as_mysql = super::running_as_root();
            let dir = std::env::temp_dir().join(super::unique_name("inbox_galera"));
            std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            // Dropped (killed and removed) on every early return below.
            let mut cluster = GaleraCluster {
                dir,
                nodes: Vec::new(),
                as_mysql,
            };
            let ports = super::free_ports(4 * NODES)?;
            for node in ports.chunks(4) {
                let &[sql, gcomm, ist, sst] = node else {
                    unreachable!("four ports a node")
                };
                cluster.nodes.push(Node {
                    sql,
                    gcomm,
                    ist,
                    sst,
                    process: std::sync::Mutex::new(None),
                });
            }
            for node in 0..NODES {
                let data = cluster.data_dir(node);
                std::fs::create_dir(&data)
                    .map_err(|e| format!("create {}: {e}", data.display()))?;
            }
            if as_mysql {
                run(Command::new("chown")
                    .args(["-R", "mysql:mysql"])
                    .arg(&cluster.dir))?;
            }
            let mut install = Command::new("mariadb-install-db");
            install
                .arg("--no-defaults")
                .arg(format!("--datadir={}", cluster.data_dir(0).display()))
                .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
                .args(["--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M"]);
            if as_mysql {
                install.arg("--user=mysql");
            }
            run(&mut install)?;

            cluster.spawn(0, true)?;
            cluster.wait_ready(0, 1)?;
            let mut conn = cluster.connect_to(0, "")?;
            diesel::sql_query(format!("CREATE DATABASE {DATABASE}"))
                .execute(&mut conn)
                .map_err(|e| format!("create the database: {e}"))?;
            let mut conn = cluster.connect_to(0, DATABASE)?;
            inbox_runtime::setup(&mut conn).map_err(|e| format!("create the inbox table: {e}"))?;
            for node in 1..NODES {
                cluster.spawn(node, false)?;
            }
            for node in 1..NODES {
                cluster.wait_ready(node, NODES)?;
            }
            Ok(cluster)
        }

        /// The URL of [`DATABASE`] on `node` (0, 1 or 2), as root.
        pub fn url(&self, node: usize) -> String {
            format!("mysql://root@127.0.0.1:{}/{DATABASE}", self.nodes[node].sql)
        }

        /// `node`'s SQL port on 127.0.0.1.
        pub fn port(&self, node: usize) -> u16 {
            self.nodes[node].sql
        }

        /// A global status variable of `node` (`wsrep_cluster_size`,
        /// `wsrep_local_cert_failures`, …), or `None` when the node cannot
        /// be reached.
        pub fn status(&self, node: usize, name: &str) -> Option<String> {
            let mut conn = self.connect_to(node, "").ok()?;
            diesel::sql_query(
                "SELECT VARIABLE_VALUE AS value FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = UPPER(?)",
            )
            .bind::<Text, _>(name)
            .get_result::<Value>(&mut conn)
            .ok()
            .map(|v| v.value)
        }

        /// Kills `node` with SIGKILL (no shutdown, no goodbye to the group)
        /// and waits for the process to end.
        ///
        /// # Panics
        /// When the node is not running.
        pub fn kill(&self, node: usize) {
            let mut process = self.nodes[node].process.lock().expect("node lock");
            let mut child = process.take().expect("the node is running");
            let _ = child.kill();
            let _ = child.wait();
        }

        /// Starts `node` again after [`kill`](Self::kill): it rejoins the
        /// cluster (state transfer from a survivor). Returns once it is
        /// ready and the cluster has 3 nodes again.
        ///
        /// # Panics
        /// When the node does not rejoin within 2 minutes.
        pub fn restart(&self, node: usize) {
            self.spawn(node, false).expect("restart the node");
            self.wait_ready(node, NODES).expect("the node rejoins");
        }

        fn connect_to(&self, node: usize, database: &str) -> Result<MysqlConnection, String> {
            let url = format!("mysql://root@127.0.0.1:{}/{database}", self.nodes[node].sql);
            MysqlConnection::establish(&url).map_err(|e| format!("{url}: {e}"))
        }

        fn data_dir(&self, node: usize) -> PathBuf {
            self.dir.join(format!("node{node}"))
        }

        fn spawn(&self, node: usize, new_cluster: bool) -> Result<(), String> {
            let n = &self.nodes[node];
            let peers: Vec<String> = self
                .nodes
                .iter()
                .map(|p| format!("127.0.0.1:{}", p.gcomm))
                .collect();
            let file = |name: &str| self.dir.join(format!("node{node}.{name}"));
            let mut provider_options = format!(
                "gmcast.listen_addr=tcp://127.0.0.1:{};ist.recv_addr=127.0.0.1:{};",
                n.gcomm, n.ist
            );
            provider_options.push_str(
                "gcache.size=16M;gcache.page_size=16M;\
                 evs.keepalive_period=PT0.5S;evs.inactive_check_period=PT0.5S;\
                 evs.suspect_timeout=PT2S;evs.inactive_timeout=PT3S;evs.install_timeout=PT3S",
            );
            let mut command = Command::new(MARIADBD);
            command
                .arg("--no-defaults")
                .arg(format!("--datadir={}", self.data_dir(node).display()))
                .arg(format!("--socket={}", file("sock").display()))
                .arg(format!("--pid-file={}", file("pid").display()))
                .arg(format!("--log-error={}", file("err").display()))
                .arg(format!("--port={}", n.sql))
                .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
                .args(["--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M"])
                .args([
                    "--innodb-log-buffer-size=1M",
                    "--innodb-flush-log-at-trx-commit=0",
                ])
                .args(["--performance-schema=OFF", "--key-buffer-size=1M"])
                .args(["--aria-pagecache-buffer-size=1M", "--max-connections=100"])
                .args(["--binlog-format=ROW", "--innodb-autoinc-lock-mode=2"])
                .args(["--default-storage-engine=InnoDB", "--wsrep-on=ON"])
                .arg(format!("--wsrep-provider={PROVIDER}"))
                .arg(format!(
                    "--wsrep-cluster-address=gcomm://{}",
                    peers.join(",")
                ))
                .arg("--wsrep-cluster-name=inbox_test")
                .arg(format!("--wsrep-node-name=node{node}"))
                .arg(format!("--wsrep-node-address=127.0.0.1:{}", n.gcomm))
                .arg(format!("--wsrep-provider-options={provider_options}"))
                .arg(format!("--wsrep-sst-receive-address=127.0.0.1:{}", n.sst))
                .args(["--wsrep-sst-method=rsync", "--wsrep-slave-threads=2"]);
            if self.as_mysql {
                command.arg("--user=mysql");
            }
            if new_cluster {
                command.arg("--wsrep-new-cluster");
            }
            let output = std::fs::File::create(file("out")).map_err(|e| e.to_string())?;
            let child = command
                .stdin(Stdio::null())
                .stdout(output.try_clone().map_err(|e| e.to_string())?)
                .stderr(output)
                .spawn()
                .map_err(|e| format!("{MARIADBD}: {e}"))?;
            *self.nodes[node].process.lock().expect("node lock") = Some(child);
            Ok(())
        }

        /// Waits until `node` says `wsrep_ready = ON` and sees a cluster of
        /// at least `size` nodes, or fails with the tail of its error log.
        fn wait_ready(&self, node: usize, size: usize) -> Result<(), String> {
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                let ready = self.status(node, "wsrep_ready").as_deref() == Some("ON");
                let members = self
                    .status(node, "wsrep_cluster_size")
                    .and_then(|s| s.parse::<usize>().ok())
                    .unwrap_or(0);
                if ready && members >= size {
                    return Ok(());
                }
                let exited = {
                    let mut process = self.nodes[node].process.lock().expect("node lock");
                    process
                        .as_mut()
                        .and_then(|child| child.try_wait().ok().flatten())
                };
                if exited.is_some() || Instant::now() > deadline {
                    let log = std::fs::read_to_string(self.dir.join(format!("node{node}.err")))
                        .unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(25).collect();
                    let mut message = format!(
                        "node {node} (port {}) not ready ({}):",
                        self.nodes[node].sql,
                        exited.map_or("timed out".to_owned(), |s| format!("exited: {s}"))
                    );
                    for line in tail.iter().rev() {
                        let _ = write!(message, "\n    {line}");
                    }
                    return Err(message);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    impl Drop for GaleraCluster {
        fn drop(&mut self) {
            for node in &self.nodes {
                if let Some(mut child) = node.process.lock().ok().and_then(|mut p| p.take()) {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// `Err` naming what is missing to run a Galera node.
    fn missing_binaries() -> Result<(), String> {
        let missing: Vec<&str> = [MARIADBD, PROVIDER]
            .into_iter()
            .filter(|path| !Path::new(path).exists())
            .chain(
                ["mariadb-install-db", "rsync", "wsrep_sst_rsync"]
                    .into_iter()
                    .filter(|program| !on_path(program)),
            )
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "missing {} (Debian: mariadb-server galera-4 rsync)",
                missing.join(", ")
            ))
        }
    }

    fn on_path(program: &str) -> bool {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| dir.join(program).is_file())
        })
    }

    fn run(command: &mut Command) -> Result<(), String> {
        let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{command:?}: {}\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }
}
