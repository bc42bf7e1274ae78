//! A throwaway PgBouncer in front of a throwaway PostgreSQL server.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use crate::mariadb::spawn_server;
use crate::postgres::PgServer;
use crate::process::{
    accepts_connections, free_ports, kill_and_remove, log_tail, on_path, os_user_ids, private_dir,
    require_installed, run, running_as_root, wait_ready, with_port_retries, write_private,
};

/// Where Debian puts the pooler (not on a normal user's `PATH`).
const PGBOUNCER: &str = "/usr/sbin/pgbouncer";
/// How long the pooler may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How PgBouncer hands server connections to its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection for each client transaction (`pool_mode =
    /// transaction`): session state (`SET`, prepared statements, advisory
    /// locks, `LISTEN`) does not follow the client from one transaction to
    /// the next.
    Transaction,
    /// A server connection for the client's whole session (`pool_mode =
    /// session`), reset with `DISCARD ALL` when the client leaves.
    Session,
}

impl PoolMode {
    fn setting(self) -> &'static str {
        match self {
            PoolMode::Transaction => "transaction",
            PoolMode::Session => "session",
        }
    }
}

/// PgBouncer of its own in front of `server`: a configuration in a fresh
/// temporary directory (mode 0700), listening on a free port of 127.0.0.1
/// only (no Unix socket), every database name passed through to the
/// server's database of that name, at most `pool_size` server connections
/// per database. Clients log in as the server's `postgres`: with its
/// password (`scram-sha-256`, the same password PgBouncer logs in to the
/// server with) when the server has one, without (`trust`) when the server
/// trusts loopback connections itself. Run as root, PgBouncer runs as the
/// `postgres` OS user (it refuses root). Killed and removed on drop.
///
/// ```no_run
/// use inbox_test_servers::{PgBouncer, PgServer, PoolMode};
///
/// let server = PgServer::start()?;
/// server.create_database("test")?;
/// let bouncer = PgBouncer::start(&server, PoolMode::Transaction, 4)?;
/// println!("{}", bouncer.url_of("test")); // postgres://postgres@127.0.0.1:<port>/test
/// # Ok::<(), String>(())
/// ```
pub struct PgBouncer {
    dir: PathBuf,
    port: u16,
    password: Option<String>,
    process: Option<Child>,
}

impl PgBouncer {
    /// `Err` naming what is missing to run PgBouncer.
    ///
    /// ```
    /// if let Err(missing) = inbox_test_servers::PgBouncer::installed() {
    ///     println!("{missing}");
    /// }
    /// ```
    pub fn installed() -> Result<(), String> {
        let missing = if on_path("pgbouncer") || Path::new(PGBOUNCER).exists() {
            vec![]
        } else {
            vec!["pgbouncer"]
        };
        require_installed(missing, &[], "pgbouncer")
    }

    /// Starts PgBouncer in front of `server` in `mode`, with `pool_size`
    /// server connections at most per database; returns once it accepts
    /// connections. A port taken over between [`free_ports`] and the start:
    /// tries twice more.
    ///
    /// ```no_run
    /// use inbox_test_servers::{PgBouncer, PgServer, PoolMode};
    ///
    /// let server = PgServer::start()?;
    /// let bouncer = PgBouncer::start(&server, PoolMode::Session, 2)?;
    /// assert_ne!(bouncer.port(), server.port());
    /// # Ok::<(), String>(())
    /// ```
    pub fn start(server: &PgServer, mode: PoolMode, pool_size: u32) -> Result<Self, String> {
        Self::installed()?;
        with_port_retries(|| Self::try_start(server, mode, pool_size, false))
    }

    /// [`start`](Self::start) with `server_round_robin = 1`: each
    /// transaction goes to the idle server connection that has been idle
    /// longest instead of the last one used, so that a client's consecutive
    /// transactions (and autocommit statements) move from one server
    /// connection to the next, as behind a pooler spreading load over them.
    ///
    /// ```no_run
    /// use inbox_test_servers::{PgBouncer, PgServer, PoolMode};
    ///
    /// let server = PgServer::start()?;
    /// let bouncer = PgBouncer::start_round_robin(&server, PoolMode::Transaction, 2)?;
    /// # Ok::<(), String>(())
    /// ```
    pub fn start_round_robin(
        server: &PgServer,
        mode: PoolMode,
        pool_size: u32,
    ) -> Result<Self, String> {
        Self::installed()?;
        with_port_retries(|| Self::try_start(server, mode, pool_size, true))
    }

    /// The port PgBouncer listens on, on 127.0.0.1.
    ///
    /// ```no_run
    /// # let server = inbox_test_servers::PgServer::start()?;
    /// let bouncer = inbox_test_servers::PgBouncer::start(&server, inbox_test_servers::PoolMode::Transaction, 4)?;
    /// assert_ne!(bouncer.port(), 6432);
    /// # Ok::<(), String>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of `database` through PgBouncer, as `postgres`.
    ///
    /// ```no_run
    /// # let server = inbox_test_servers::PgServer::start()?;
    /// let bouncer = inbox_test_servers::PgBouncer::start(&server, inbox_test_servers::PoolMode::Transaction, 4)?;
    /// assert!(bouncer.url_of("test").ends_with("/test"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn url_of(&self, database: &str) -> String {
        let credentials = match &self.password {
            Some(password) => format!("postgres:{password}"),
            None => "postgres".to_owned(),
        };
        format!(
            "postgres://{credentials}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    fn try_start(
        server: &PgServer,
        mode: PoolMode,
        pool_size: u32,
        round_robin: bool,
    ) -> Result<Self, String> {
        let as_postgres = running_as_root();
        let dir = private_dir("inbox_pgbouncer", as_postgres.then_some("postgres"))?;
        let mut bouncer = PgBouncer {
            dir,
            port: free_ports(1)?[0],
            password: server.password().map(str::to_owned),
            process: None,
        };
        let users = bouncer.dir.join("userlist.txt");
        let (auth_type, user_line) = match &bouncer.password {
            Some(password) => ("scram-sha-256", format!("\"postgres\" \"{password}\"\n")),
            None => ("trust", "\"postgres\" \"\"\n".to_owned()),
        };
        write_private(&users, &user_line)?;
        let config = bouncer.dir.join("pgbouncer.ini");
        write_private(
            &config,
            &format!(
                "[databases]\n\
                 * = host=127.0.0.1 port={server_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = {auth_type}\n\
                 auth_file = {users}\n\
                 pool_mode = {mode}\n\
                 default_pool_size = {pool_size}\n\
                 server_round_robin = {round_robin}\n\
                 max_client_conn = 500\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {log}\n\
                 pidfile = {pid}\n",
                server_port = server.port(),
                port = bouncer.port,
                users = users.display(),
                mode = mode.setting(),
                round_robin = u8::from(round_robin),
                log = bouncer.log().display(),
                pid = bouncer.dir.join("pgbouncer.pid").display(),
            ),
        )?;
        let binary = if on_path("pgbouncer") {
            PathBuf::from("pgbouncer")
        } else {
            PathBuf::from(PGBOUNCER)
        };
        let mut command = Command::new(binary);
        command.arg(&config).current_dir(&bouncer.dir);
        if as_postgres {
            run(Command::new("chown")
                .arg("postgres:postgres")
                .args([&users, &config]))?;
            let (uid, gid) = os_user_ids("postgres")?;
            command.uid(uid).gid(gid);
        }
        bouncer.process = Some(spawn_server(
            &mut command,
            &bouncer.dir.join("pgbouncer.out"),
        )?);
        bouncer.wait_ready()?;
        Ok(bouncer)
    }

    fn log(&self) -> PathBuf {
        self.dir.join("pgbouncer.log")
    }

    /// Waits until the port accepts connections, or fails with the tail of
    /// the log when PgBouncer exits or takes too long.
    fn wait_ready(&mut self) -> Result<(), String> {
        let (port, log) = (self.port, self.log());
        wait_ready(
            &format!("PgBouncer on port {port}"),
            &mut self.process,
            START_TIMEOUT,
            || accepts_connections(port),
            || log_tail(&log, 15),
        )
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        kill_and_remove(&mut self.process, &self.dir);
    }
}
