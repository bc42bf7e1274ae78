//! The servers live in a guardian process of their own, so that they are
//! stopped however the test command ends: a test failure, a Ctrl-C, a kill.
//!
//! `cargo xtask test` runs `xtask __serve --backend …` in a process group of
//! its own (a Ctrl-C at the terminal does not reach it), with a pipe on
//! each side. The guardian starts the servers, writes the environment that
//! points the suite at them (`NAME=value` lines, then `ready`), and waits
//! for the end of its standard input: the test command closes it when the
//! suite is done, and the kernel closes it when the test command dies. The
//! guardian then stops and removes the servers, and the run's scratch
//! directory, the suite's `TMPDIR` (see [`crate::scratch`]), with whatever a
//! test left running from it.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::backend::Backend;
use crate::scratch::Scratch;
use crate::servers::Servers;

/// The hidden command the guardian runs as.
pub const SERVE: &str = "__serve";
/// The last line of the guardian's report.
const READY: &str = "ready";

/// The test command's side: the guardian, and the environment it reported.
pub struct Guard {
    child: Child,
    stdin: Option<ChildStdin>,
    environment: Vec<(String, String)>,
}

impl Guard {
    /// Starts the guardian for `backends` and waits for its servers.
    pub fn spawn(backends: &[Backend]) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("find xtask itself: {e}"))?;
        let mut command = Command::new(exe);
        command.arg(SERVE);
        for backend in backends {
            command.args(["--backend", backend.feature()]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("start the server guardian: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("a piped stdout");
        let mut guard = Guard {
            child,
            stdin,
            environment: Vec::new(),
        };
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("read the server guardian: {e}"))?;
            if line == READY {
                return Ok(guard);
            }
            let (name, value) = line
                .split_once('=')
                .ok_or_else(|| format!("the server guardian said `{line}`"))?;
            guard.environment.push((name.to_owned(), value.to_owned()));
        }
        Err("the servers did not start".to_owned())
    }

    /// The variables to set for the suite.
    pub fn environment(&self) -> &[(String, String)] {
        &self.environment
    }
}

impl Drop for Guard {
    /// Closes the guardian's input and waits while it stops the servers.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// The guardian's side: starts the servers of `backends`, reports their
/// environment and the scratch directory (`TMPDIR`) on standard output, and
/// stops and removes them at the end of standard input.
pub fn serve(backends: &[Backend]) -> Result<(), String> {
    // Declared first, dropped last: after the servers.
    let scratch = Scratch::create()?;
    let servers = Servers::start(backends)?;
    let mut report = format!("TMPDIR={}\n", scratch.path().display());
    for (name, value) in servers.environment() {
        report.push_str(&format!("{name}={value}\n"));
    }
    report.push_str(READY);
    report.push('\n');
    let mut stdout = std::io::stdout().lock();
    // A test command that died meanwhile: the write fails, and the servers
    // are dropped at once.
    if stdout
        .write_all(report.as_bytes())
        .and_then(|()| stdout.flush())
        .is_ok()
    {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
    }
    Ok(())
}
