//! A throwaway NATS server with JetStream.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_ports, log_tail, private_dir};

/// How long a start may take before it fails.
const START_LIMIT: Duration = Duration::from_secs(15);
/// What the server logs once it accepts clients (its streams restored).
const READY: &str = "Server is ready";
/// Names the binary when it is not `nats-server` on `PATH` or in Debian's place.
const BINARY_VARIABLE: &str = "INBOX_TEST_NATS_SERVER";

/// A NATS server of its own: `nats-server -js` on 127.0.0.1, on a port
/// nobody listened on, storing in a fresh temporary directory (mode 0700),
/// so that a test may SIGKILL it and start it again on the same port and
/// store. Killed, and its directory removed, on drop.
///
/// ```no_run
/// use inbox_test_servers::NatsServer;
///
/// let mut nats = NatsServer::start()?;
/// println!("{}", nats.url()); // nats://127.0.0.1:<port>
/// nats.kill(); // as a crash leaves it
/// nats.restart()?; // the same port and store
/// # Ok::<(), String>(())
/// ```
pub struct NatsServer {
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    /// Where the log of the current start begins.
    log_from: u64,
}

impl NatsServer {
    /// Starts a server: the binary is `INBOX_TEST_NATS_SERVER`, else
    /// `nats-server` on `PATH` or in `/usr/sbin`. Tries three ports before
    /// it gives up (another process may take a port between its pick and the
    /// server's bind).
    ///
    /// ```no_run
    /// let nats = inbox_test_servers::NatsServer::start()?;
    /// assert!(nats.url().starts_with("nats://127.0.0.1:"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn start() -> Result<NatsServer, String> {
        let binary = Self::binary()?;
        let dir = private_dir("inbox_nats", None)?;
        let mut server = NatsServer {
            binary,
            dir,
            port: 0,
            child: None,
            log_from: 0,
        };
        let mut failures = Vec::new();
        for _ in 0..3 {
            server.port = free_ports(1)?[0];
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(error) => failures.push(error),
            }
        }
        Err(failures.join("\n"))
    }

    /// The server binary, or an error naming the package that brings it.
    ///
    /// ```
    /// if let Err(missing) = inbox_test_servers::NatsServer::binary() {
    ///     println!("{missing}");
    /// }
    /// ```
    pub fn binary() -> Result<PathBuf, String> {
        if let Some(binary) = std::env::var_os(BINARY_VARIABLE) {
            return Ok(PathBuf::from(binary));
        }
        let on_path = std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
            .unwrap_or_default();
        on_path
            .iter()
            .map(PathBuf::as_path)
            .chain([Path::new("/usr/sbin"), Path::new("/usr/local/bin")])
            .map(|dir| dir.join("nats-server"))
            .find(|binary| binary.is_file())
            .ok_or_else(|| {
                format!("no nats-server binary (Debian: nats-server; or set {BINARY_VARIABLE})")
            })
    }

    /// `nats://127.0.0.1:<port>`.
    ///
    /// ```no_run
    /// let nats = inbox_test_servers::NatsServer::start()?;
    /// assert_ne!(nats.url(), "nats://127.0.0.1:4222");
    /// # Ok::<(), String>(())
    /// ```
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the server (no shutdown of its own: its store is as a crash
    /// leaves it) and waits for its end.
    ///
    /// ```no_run
    /// let mut nats = inbox_test_servers::NatsServer::start()?;
    /// nats.kill();
    /// # Ok::<(), String>(())
    /// ```
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and store (killing it first
    /// if it still runs); returns once it accepts clients.
    ///
    /// ```no_run
    /// let mut nats = inbox_test_servers::NatsServer::start()?;
    /// nats.restart()?;
    /// # Ok::<(), String>(())
    /// ```
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.launch()
    }

    /// The last lines of the server's log, indented, for a failure's message.
    ///
    /// ```no_run
    /// let nats = inbox_test_servers::NatsServer::start()?;
    /// assert!(nats.log_tail().contains("Server is ready"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn log_tail(&self) -> String {
        log_tail(&self.log(), 15)
    }

    fn log(&self) -> PathBuf {
        self.dir.join("nats.log")
    }

    /// Starts the process and waits until it logs that it is ready.
    fn launch(&mut self) -> Result<(), String> {
        self.log_from = std::fs::metadata(self.log()).map_or(0, |m| m.len());
        let child = Command::new(&self.binary)
            .arg("-js")
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .arg("-sd")
            .arg(self.dir.join("store"))
            .arg("-l")
            .arg(self.log())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if self.logged_since_launch().contains(READY) {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                return Err(format!(
                    "nats-server on port {} exited ({status}):{}",
                    self.port,
                    self.log_tail()
                ));
            }
            if started.elapsed() > START_LIMIT {
                self.kill();
                return Err(format!(
                    "nats-server on port {} not ready after {} s:{}",
                    self.port,
                    START_LIMIT.as_secs(),
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn logged_since_launch(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(self.log()) {
            if file.seek(SeekFrom::Start(self.log_from)).is_ok() {
                let _ = file.read_to_string(&mut text);
            }
        }
        text
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
