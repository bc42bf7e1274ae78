//! A throwaway MariaDB server from the installed binaries, and the `mariadb`
//! client that every MariaDB server here is queried with.

use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{
    free_ports, kill_and_remove, log_tail, on_path, private_dir, require_installed, run,
    running_as_root, wait_ready, with_port_retries,
};
use crate::secret::random_password;

/// Where Debian puts the server (not on a normal user's `PATH`).
const MARIADBD: &str = "/usr/sbin/mariadbd";
/// The user the suite connects as, on 127.0.0.1 only.
const USER: &str = "inbox";
/// How long the server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A MariaDB server of its own: `mariadb-install-db` into a fresh temporary
/// directory (mode 0700), `mariadbd` on a free port on 127.0.0.1 only, its
/// socket inside that directory, a user `inbox`@`127.0.0.1` with every
/// privilege and a random password (created by the server's `--init-file`
/// at its start). `root` keeps the installation's default, the socket
/// authentication of the OS user. Character set `utf8mb4`
/// (`utf8mb4_general_ci`), as Debian's packaged server. Run as root, the
/// server runs as the `mysql` OS user. Killed and removed on drop.
///
/// ```no_run
/// use inbox_test_servers::MariaDbServer;
///
/// let server = MariaDbServer::start()?;
/// server.create_database("test")?;
/// assert_eq!(server.sql("SELECT 1 + 1")?, "2");
/// println!("{}", server.url_of("test")); // mysql://inbox:<password>@127.0.0.1:<port>/test
/// # Ok::<(), String>(())
/// ```
pub struct MariaDbServer {
    dir: PathBuf,
    port: u16,
    password: String,
    process: Option<Child>,
}

impl MariaDbServer {
    /// Installs and starts a server; returns once it accepts connections.
    /// A port taken over between [`free_ports`] and the start: tries twice
    /// more.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::MariaDbServer::start()?;
    /// assert!(server.url_of("mysql").starts_with("mysql://inbox:"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn start() -> Result<Self, String> {
        Self::installed()?;
        with_port_retries(Self::try_start)
    }

    /// `Err` naming what is missing to run a server (`mariadbd`,
    /// `mariadb-install-db`, the `mariadb` client).
    ///
    /// ```
    /// if let Err(missing) = inbox_test_servers::MariaDbServer::installed() {
    ///     println!("{missing}");
    /// }
    /// ```
    pub fn installed() -> Result<(), String> {
        let mut missing = Vec::new();
        if !mariadbd_installed() {
            missing.push("mariadbd");
        }
        require_installed(
            missing,
            &["mariadb-install-db", "mariadb"],
            "mariadb-server",
        )
    }

    fn try_start() -> Result<Self, String> {
        let as_mysql = running_as_root();
        let dir = private_dir("inbox_mariadb", as_mysql.then_some("mysql"))?;
        // Dropped (killed and removed) on every early return below.
        let mut server = MariaDbServer {
            dir,
            port: free_ports(1)?[0],
            password: random_password()?,
            process: None,
        };
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", server.data_dir().display()))
            .args(["--auth-root-authentication-method=socket", "--skip-test-db"])
            .arg("--skip-name-resolve");
        if as_mysql {
            install.arg("--user=mysql");
        }
        run(&mut install)?;
        // Run by the server at its start, once the grant tables are loaded
        // (one statement a line); removed once the server is ready.
        let init = server.dir.join("init.sql");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&init)
            .and_then(|mut file| {
                use std::io::Write as _;
                write!(
                    file,
                    "CREATE USER IF NOT EXISTS '{USER}'@'127.0.0.1' IDENTIFIED BY '{}';\n\
                     GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'127.0.0.1' WITH GRANT OPTION;\n",
                    server.password
                )
            })
            .map_err(|e| format!("write {}: {e}", init.display()))?;
        if as_mysql {
            run(Command::new("chown").arg("mysql:mysql").arg(&init))?;
        }

        let mut command = Command::new(mariadbd());
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", server.data_dir().display()))
            .arg(format!(
                "--socket={}",
                server.dir.join("mysqld.sock").display()
            ))
            .arg(format!(
                "--pid-file={}",
                server.dir.join("mysqld.pid").display()
            ))
            .arg(format!("--log-error={}", server.log().display()))
            .arg(format!("--port={}", server.port))
            .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
            .args([
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_general_ci",
            ])
            .arg(format!("--init-file={}", init.display()));
        if as_mysql {
            command.arg("--user=mysql");
        }
        server.process = Some(spawn_server(&mut command, &server.dir.join("mysqld.out"))?);
        let ready = server.wait_ready();
        let _ = std::fs::remove_file(&init);
        ready?;
        Ok(server)
    }

    /// The server's port on 127.0.0.1.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::MariaDbServer::start()?;
    /// assert_ne!(server.port(), 3306);
    /// # Ok::<(), String>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://inbox:<password>@127.0.0.1:<port>/<database>`.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::MariaDbServer::start()?;
    /// assert!(server.url_of("test").ends_with("/test"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn url_of(&self, database: &str) -> String {
        format!(
            "mysql://{USER}:{}@127.0.0.1:{}/{database}",
            self.password, self.port
        )
    }

    /// `CREATE DATABASE <name>`.
    ///
    /// ```no_run
    /// let server = inbox_test_servers::MariaDbServer::start()?;
    /// server.create_database("test")?;
    /// # Ok::<(), String>(())
    /// ```
    pub fn create_database(&self, name: &str) -> Result<(), String> {
        self.sql(&format!("CREATE DATABASE {name}")).map(drop)
    }

    /// Runs `sql` with the `mariadb` client as user `inbox`; returns what
    /// it printed (tab-separated, no column names, trimmed).
    ///
    /// ```no_run
    /// let server = inbox_test_servers::MariaDbServer::start()?;
    /// assert_eq!(server.sql("SELECT @@character_set_server")?, "utf8mb4");
    /// # Ok::<(), String>(())
    /// ```
    pub fn sql(&self, sql: &str) -> Result<String, String> {
        client(self.port, USER, &self.password, sql)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("error.log")
    }

    /// Waits until user `inbox` can run a query (the init file has run), or
    /// fails with the tail of the error log when the server exits or takes
    /// too long.
    fn wait_ready(&mut self) -> Result<(), String> {
        let (port, password, log) = (self.port, self.password.clone(), self.log());
        wait_ready(
            &format!("MariaDB on port {port}"),
            &mut self.process,
            START_TIMEOUT,
            || client(port, USER, &password, "SELECT 1").is_ok(),
            || log_tail(&log, 25),
        )
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        kill_and_remove(&mut self.process, &self.dir);
    }
}

/// The server binary: `mariadbd` on `PATH`, else Debian's `/usr/sbin/mariadbd`.
pub(crate) fn mariadbd() -> PathBuf {
    if on_path("mariadbd") {
        PathBuf::from("mariadbd")
    } else {
        PathBuf::from(MARIADBD)
    }
}

/// Whether the server binary is installed.
fn mariadbd_installed() -> bool {
    on_path("mariadbd") || Path::new(MARIADBD).exists()
}

/// Spawns a server process with its output in `output`, in a process group
/// of its own: a Ctrl-C at the terminal reaches the test command, which
/// stops the server on its way out, not the server directly.
pub(crate) fn spawn_server(command: &mut Command, output: &Path) -> Result<Child, String> {
    let file =
        std::fs::File::create(output).map_err(|e| format!("create {}: {e}", output.display()))?;
    command
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("{command:?}: {e}"))
}

/// Runs `sql` with the `mariadb` client on 127.0.0.1:`port` as `user`
/// (password `password`, empty for none); returns what it printed
/// (tab-separated, no column names, trimmed).
pub(crate) fn client(port: u16, user: &str, password: &str, sql: &str) -> Result<String, String> {
    let mut command = Command::new("mariadb");
    command
        .args(["--no-defaults", "--batch", "--skip-column-names"])
        .args(["--connect-timeout=10", "-h", "127.0.0.1"])
        .arg(format!("--port={port}"))
        .arg(format!("--user={user}"))
        .args(["-e", sql])
        // Not on the command line, where `ps` would show it.
        .env("MYSQL_PWD", password);
    run(&mut command).map(|out| out.trim().to_owned())
}
