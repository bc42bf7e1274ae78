//! A throwaway PostgreSQL server from the installed binaries.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::{free_ports, private_dir, run, running_as_root};
use crate::secret::random_password;

mod standby;

pub use standby::Replication;

/// The environment variable naming the directory of the PostgreSQL binaries.
const BIN_ENV: &str = "INBOX_TEST_PG_BIN";

/// A PostgreSQL server of its own: `initdb` into a fresh temporary directory
/// (mode 0700), a free port on 127.0.0.1 only, its Unix socket inside that
/// directory, superuser `postgres`, database `postgres`. Stopped (immediate
/// mode) and removed on drop.
///
/// Two kinds: [`PgServer::start`] is a test's own small server, for the
/// faults a test must not inflict on a shared one (an immediate restart, a
/// read-only setting), with trust authentication on 127.0.0.1 (it lives as
/// long as the test); [`PgServer::start_protected`] is the suite's server,
/// with a random password (`scram-sha-256`), which [`PgServer::url`] carries.
///
/// The binaries come from `INBOX_TEST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin` ([`PgServer::bin_dir`]). Run as root,
/// they run as the `postgres` OS user (`runuser`). `fsync` is off: only the
/// server's processes ever die here, never the machine, so a commit written
/// to the kernel survives an immediate stop (`synchronous_commit` stays on).
/// `wal_log_hints` is on and `wal_keep_size` 128 MB, so that a failed-over
/// primary can rejoin as a standby (`pg_rewind` reads its WAL back to the
/// last checkpoint before the two diverged).
/// SQL goes through the server's own `psql`. [`PgServer::start_standby`]
/// makes a streaming standby of a server (synchronous or asynchronous),
/// [`PgServer::promote`] promotes it.
///
/// ```no_run
/// use inbox_test_servers::PgServer;
///
/// let server = PgServer::start()?;
/// server.psql("CREATE TABLE t (id int)")?;
/// server.restart_immediate(); // every connection to it is now dead
/// server.set_read_only(true); // new transactions fail with 25006
/// assert_eq!(server.psql("SHOW default_transaction_read_only")?, "on");
/// # Ok::<(), String>(())
/// ```
pub struct PgServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
    password: Option<String>,
}

/// What distinguishes the suite's server from a test's own.
struct Settings {
    password: Option<String>,
    max_connections: u32,
    shared_buffers: &'static str,
}

impl PgServer {
    /// Creates and starts a test's own small server (trust authentication
    /// on 127.0.0.1, 40 connections, 16 MB of shared buffers).
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// assert!(server.url().starts_with("postgres://postgres@127.0.0.1:"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn start() -> Result<Self, String> {
        Self::start_with(|| {
            Ok(Settings {
                password: None,
                max_connections: 40,
                shared_buffers: "16MB",
            })
        })
    }

    /// Creates and starts a server for a whole test suite: superuser
    /// `postgres` with a random password (`scram-sha-256` for every
    /// connection, over TCP and the socket), 100 connections, 128 MB of
    /// shared buffers.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start_protected()?;
    /// assert!(server.url().starts_with("postgres://postgres:"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn start_protected() -> Result<Self, String> {
        Self::start_with(|| {
            Ok(Settings {
                password: Some(random_password()?),
                max_connections: 100,
                shared_buffers: "128MB",
            })
        })
    }

    /// A port taken over between [`free_ports`] and the start: tries twice more.
    fn start_with(settings: impl Fn() -> Result<Settings, String>) -> Result<Self, String> {
        let bin = Self::bin_dir()?;
        let mut last_error = String::new();
        for _ in 0..3 {
            match Self::try_start(&bin, settings()?) {
                Ok(server) => return Ok(server),
                Err(error) => last_error = error,
            }
        }
        Err(format!("{}: {last_error}", bin.display()))
    }

    fn try_start(bin: &Path, settings: Settings) -> Result<Self, String> {
        let as_postgres = running_as_root();
        let dir = private_dir("inbox_pg", as_postgres.then_some("postgres"))?;
        // Dropped (stopped and removed) on every early return below.
        let server = PgServer {
            bin: bin.to_owned(),
            dir,
            port: free_ports(1)?[0],
            as_postgres,
            password: settings.password,
        };
        let data = server.data_dir();
        let mut initdb = server.command("initdb");
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        let pwfile = server.dir.join("pwfile");
        match &server.password {
            None => {
                initdb.args(["-A", "trust"]);
            }
            Some(password) => {
                server.write_private(&pwfile, password)?;
                initdb
                    .args(["-A", "scram-sha-256"])
                    .arg("--pwfile")
                    .arg(&pwfile);
            }
        }
        let initialized = server.run(&mut initdb);
        let _ = std::fs::remove_file(&pwfile);
        initialized?;
        server.append_conf(&format!(
            "fsync = off\nmax_connections = {}\nshared_buffers = {}\nwal_log_hints = on\nwal_keep_size = 128MB\n",
            settings.max_connections, settings.shared_buffers,
        ))?;
        server.pg_ctl(&["start"])?;
        Ok(server)
    }

    /// `INBOX_TEST_PG_BIN`, else the newest `/usr/lib/postgresql/<version>/bin`
    /// with an `initdb`.
    ///
    /// ```no_run
    /// let bin = inbox_test_servers::PgServer::bin_dir()?;
    /// assert!(bin.join("initdb").exists());
    /// # Ok::<(), String>(())
    /// ```
    pub fn bin_dir() -> Result<PathBuf, String> {
        if let Ok(dir) = std::env::var(BIN_ENV) {
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

    /// The server's port on 127.0.0.1.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// assert_ne!(server.port(), 5432);
    /// # Ok::<(), String>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The password of superuser `postgres`: `None` for a test's own server,
    /// which trusts connections from 127.0.0.1.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// assert_eq!(server.password(), None);
    /// # Ok::<(), String>(())
    /// ```
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// `127.0.0.1:<port>`, for a multi-host URL.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// assert_eq!(server.host_port(), format!("127.0.0.1:{}", server.port()));
    /// # Ok::<(), String>(())
    /// ```
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `postgres://postgres[:<password>]@127.0.0.1:<port>/postgres`.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// assert!(server.url().ends_with("/postgres"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn url(&self) -> String {
        self.url_of("postgres")
    }

    /// The URL of `database` on this server, as superuser `postgres`.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start_protected()?;
    /// server.create_database("test")?;
    /// assert!(server.url_of("test").ends_with("/test"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn url_of(&self, database: &str) -> String {
        let credentials = match &self.password {
            Some(password) => format!("postgres:{password}"),
            None => "postgres".to_owned(),
        };
        format!("postgres://{credentials}@{}/{database}", self.host_port())
    }

    /// `CREATE DATABASE <name>`.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// server.create_database("test")?;
    /// # Ok::<(), String>(())
    /// ```
    pub fn create_database(&self, name: &str) -> Result<(), String> {
        self.psql(&format!("CREATE DATABASE {name}")).map(drop)
    }

    /// Runs `sql` with the server's own `psql` in a new session of
    /// superuser `postgres` on database `postgres`; returns what it printed
    /// (unaligned, tuples only, trimmed).
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// assert_eq!(server.psql("SELECT 1 + 1")?, "2");
    /// # Ok::<(), String>(())
    /// ```
    pub fn psql(&self, sql: &str) -> Result<String, String> {
        let mut command = Command::new(self.bin.join("psql"));
        command
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "10");
        self.with_password(&mut command);
        run(&mut command).map(|out| out.trim().to_owned())
    }

    /// Stops the server in immediate mode (every backend is killed, no
    /// checkpoint: crash recovery at the next start) and starts it again
    /// on the same port; returns once it accepts connections.
    ///
    /// # Panics
    /// When `pg_ctl` fails.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// server.restart_immediate();
    /// # Ok::<(), String>(())
    /// ```
    pub fn restart_immediate(&self) {
        self.pg_ctl(&["restart", "-m", "immediate"])
            .expect("restart the throwaway server");
    }

    /// Stops the server in immediate mode; [`PgServer::resume`] starts it again.
    ///
    /// # Panics
    /// When `pg_ctl` fails.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// server.stop_immediate();
    /// server.resume();
    /// # Ok::<(), String>(())
    /// ```
    pub fn stop_immediate(&self) {
        self.pg_ctl(&["stop", "-m", "immediate"])
            .expect("stop the throwaway server");
    }

    /// Starts a server stopped with [`PgServer::stop_immediate`].
    ///
    /// # Panics
    /// When `pg_ctl` fails.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// server.stop_immediate();
    /// server.resume();
    /// # Ok::<(), String>(())
    /// ```
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
    ///
    /// ```no_run
    /// let server = inbox_test_servers::PgServer::start()?;
    /// server.set_read_only(true);
    /// # Ok::<(), String>(())
    /// ```
    pub fn set_read_only(&self, on: bool) {
        let value = if on { "on" } else { "off" };
        self.psql(&format!(
            "ALTER SYSTEM SET default_transaction_read_only = {value}"
        ))
        .expect("ALTER SYSTEM");
        self.psql("SELECT pg_reload_conf()")
            .expect("reload the configuration");
        // The postmaster reloads on the signal, asynchronously; every `psql`
        // is a new session.
        let started = Instant::now();
        loop {
            let seen = self
                .psql("SELECT current_setting('default_transaction_read_only')")
                .expect("read the setting");
            if seen == value {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "new sessions still see default_transaction_read_only = {seen}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Appends `lines` to `postgresql.conf`, after this server's own
    /// address (port, 127.0.0.1 only, the socket in its directory): later
    /// lines win, so a copied configuration gets this server's address.
    fn append_conf(&self, lines: &str) -> Result<(), String> {
        let conf = self.data_dir().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).map_err(|e| e.to_string())?;
        text.push_str(&format!(
            "\nport = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n{lines}",
            self.port,
            self.dir.display(),
        ));
        std::fs::write(&conf, text).map_err(|e| e.to_string())
    }

    /// `PGPASSWORD` for the server's own client programs, when it has one.
    fn with_password<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        match &self.password {
            Some(password) => command.env("PGPASSWORD", password),
            None => command.env_remove("PGPASSWORD"),
        }
    }

    /// Writes `contents` to a new file of mode 0600 that the server's OS
    /// user owns.
    fn write_private(&self, path: &Path, contents: &str) -> Result<(), String> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut file| file.write_all(contents.as_bytes()))
            .map_err(|e| format!("write {}: {e}", path.display()))?;
        if self.as_postgres {
            run(Command::new("chown").arg("postgres:postgres").arg(path))?;
        }
        Ok(())
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

    /// [`run`], with the server's log in the error.
    fn run(&self, command: &mut Command) -> Result<(), String> {
        run(command).map(drop).map_err(|error| {
            let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
            format!("{error}\n{log}")
        })
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
