//! What every throwaway server needs from the machine: a unique name, free
//! ports, a private directory, and commands run to completion.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A name no other test (in this or a concurrent run) uses.
///
/// ```
/// let a = inbox_test_servers::unique_name("t");
/// let b = inbox_test_servers::unique_name("t");
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

/// Whether this process runs as root (the throwaway servers then run as
/// their own system user, as their binaries require).
///
/// ```
/// let _root: bool = inbox_test_servers::running_as_root();
/// ```
pub fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `count` distinct ports nobody listens on now, for the throwaway servers
/// (the OS picks them; all are held until all are picked, then released).
///
/// ```
/// let ports = inbox_test_servers::free_ports(2)?;
/// assert_ne!(ports[0], ports[1]);
/// # Ok::<(), String>(())
/// ```
pub fn free_ports(count: usize) -> Result<Vec<u16>, String> {
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

/// A fresh directory `<temp>/<prefix>_<unique>`, mode 0700, owned by the
/// system user `owner` when given (root hands it to `postgres` or `mysql`).
pub(crate) fn private_dir(prefix: &str, owner: Option<&str>) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(unique_name(prefix));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("create {}: {e}", dir.display()))?;
    if let Some(owner) = owner {
        run(Command::new("chown")
            .arg(format!("{owner}:{owner}"))
            .arg(&dir))?;
    }
    Ok(dir)
}

/// Runs `command` to completion: its standard output, or an error with its
/// status and both outputs.
pub(crate) fn run(command: &mut Command) -> Result<String, String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{command:?}: {}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Whether `program` is an executable file on `PATH`.
pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// `Ok` when nothing is `missing` and every one of `programs` is on `PATH`;
/// otherwise `Err` naming what is missing and the Debian `packages` that
/// bring it.
pub(crate) fn require_installed(
    mut missing: Vec<&'static str>,
    programs: &[&'static str],
    packages: &str,
) -> Result<(), String> {
    missing.extend(programs.iter().copied().filter(|program| !on_path(program)));
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "missing {} (Debian: {packages})",
            missing.join(", ")
        ))
    }
}

/// The last `lines` lines of the log file at `path`, indented, for an error.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(lines).collect();
    tail.iter()
        .rev()
        .map(|line| format!("\n    {line}"))
        .collect()
}

/// Writes `text` to a new file at `path` readable by its owner only.
pub(crate) fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| format!("write {}: {e}", path.display()))
}

/// The user and group ids of OS user `name`.
pub(crate) fn os_user_ids(name: &str) -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        run(Command::new("id").args([flag, name]))?
            .trim()
            .parse()
            .map_err(|e| format!("id {flag} {name}: {e}"))
    };
    Ok((id("-u")?, id("-g")?))
}

/// Calls `start` up to three times: a port [`free_ports`] picked may be
/// taken by another process before the server binds it. The last error
/// when every try failed.
pub(crate) fn with_port_retries<T>(
    mut start: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let mut last_error = String::new();
    for _ in 0..3 {
        match start() {
            Ok(server) => return Ok(server),
            Err(error) => last_error = error,
        }
    }
    Err(last_error)
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub(crate) fn accepts_connections(port: u16) -> bool {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(1)).is_ok()
}

/// Waits until `ready()` says so, or fails when the server's `process`
/// exits or `timeout` passes: the error names `what` and ends with
/// `tail()` (the end of its log).
pub(crate) fn wait_ready(
    what: &str,
    process: &mut Option<Child>,
    timeout: std::time::Duration,
    mut ready: impl FnMut() -> bool,
    tail: impl Fn() -> String,
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if ready() {
            return Ok(());
        }
        let exited = process
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten());
        if exited.is_some() || std::time::Instant::now() > deadline {
            return Err(format!(
                "{what} not ready ({}):{}",
                exited.map_or("timed out".to_owned(), |s| format!("exited: {s}")),
                tail()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Kills the server's `process` (if it runs) and waits for its end, then
/// removes its directory `dir`.
pub(crate) fn kill_and_remove(process: &mut Option<Child>, dir: &Path) {
    if let Some(mut child) = process.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The parent and the process group of process `pid` (from
/// `/proc/<pid>/stat`), or `None` when it is gone.
///
/// ```
/// let (_parent, group) = inbox_test_servers::parent_and_group(std::process::id()).unwrap();
/// assert!(group > 0);
/// ```
pub fn parent_and_group(pid: u32) -> Option<(u32, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp …`; comm may hold spaces and parentheses.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    Some((parent, group))
}

/// SIGKILLs every one of `targets` (`kill -KILL -- <pid or -group>…`), and
/// says nothing of one already gone: the others are killed all the same.
///
/// ```no_run
/// inbox_test_servers::kill_quietly(&["12345".to_owned(), "-12340".to_owned()]);
/// ```
pub fn kill_quietly(targets: &[String]) {
    if targets.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg("-KILL")
        .arg("--")
        .args(targets)
        .stderr(std::process::Stdio::null())
        .status();
}
