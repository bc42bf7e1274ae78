//! A NATS server with JetStream of the test's own: `nats-server -js` on
//! 127.0.0.1, on a port nobody listens on, storing in a fresh temporary
//! directory (`-sd`), so that the test may SIGKILL it and start it again on
//! the same port and store. Killed, and its directory removed, on drop
//! (also when the test panics).

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a start may take before it fails.
const START_LIMIT: Duration = Duration::from_secs(15);

/// What the server logs once it accepts clients (JetStream's streams
/// restored before).
const READY: &str = "Server is ready";

/// The throwaway server.
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
    /// `nats-server` on `PATH` or in `/usr/sbin`, `/usr/local/bin`. Tries
    /// three ports before it gives up (another process may take a port
    /// between its pick and the server's bind).
    pub async fn start() -> Result<NatsServer, String> {
        let binary = binary()?;
        let dir = std::env::temp_dir().join(inbox_tests::unique_name("outbox_hop_nats"));
        std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let mut server = NatsServer {
            binary,
            dir,
            port: 0,
            child: None,
            log_from: 0,
        };
        let mut failures = Vec::new();
        for _ in 0..3 {
            server.port = inbox_test_servers::free_ports(1)?[0];
            match server.launch().await {
                Ok(()) => return Ok(server),
                Err(error) => failures.push(error),
            }
        }
        Err(failures.join("\n"))
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the server (no shutdown of its own: its store is as a crash
    /// leaves it) and waits for its end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the killed server again, on the same port and store.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.launch().await
    }

    /// The last lines of the server's log, for a failure's message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().rev().take(15).collect();
        lines
            .iter()
            .rev()
            .map(|line| format!("\n    {line}"))
            .collect()
    }

    fn log(&self) -> PathBuf {
        self.dir.join("nats.log")
    }

    /// Starts the process and waits until it logs that it is ready.
    async fn launch(&mut self) -> Result<(), String> {
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
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn logged_since_launch(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(self.log()) {
            use std::io::Seek as _;
            if file.seek(std::io::SeekFrom::Start(self.log_from)).is_ok() {
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

fn binary() -> Result<PathBuf, String> {
    if let Some(binary) = std::env::var_os("INBOX_TEST_NATS_SERVER") {
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
            "no nats-server binary (Debian: nats-server; or set INBOX_TEST_NATS_SERVER)".to_owned()
        })
}
