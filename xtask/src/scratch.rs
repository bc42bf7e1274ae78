//! The run's scratch directory: the suite's `TMPDIR`, removed at the end
//! with whatever still runs from it.
//!
//! The tests put their own throwaway servers (a failover's PostgreSQL pair,
//! a restarted NATS server) and files in the temporary directory and remove
//! them when they end. A test process killed by a Ctrl-C never gets there:
//! its servers, started in process groups of their own, would run on and
//! their directories stay. Every one of them lives under this directory, so
//! the guardian kills what still runs from it and removes it.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

/// The directory, removed (with its processes) on drop.
pub struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    /// Creates `<temp>/inbox_suite_<unique>` with the mode of `/tmp` (1777:
    /// everyone may create, only the owner of an entry may remove it): the
    /// servers' system users (`postgres`, `mysql`) use it as their
    /// temporary directory too.
    pub fn create() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(inbox_test_servers::unique_name("inbox_suite"));
        std::fs::DirBuilder::new()
            .mode(0o1777)
            .create(&dir)
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        // The mode is filtered by the umask on creation; set it as asked.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
        Ok(Scratch { dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let killed = kill_processes_under(&self.dir);
        if killed > 0 {
            eprintln!("xtask: killed {killed} process(es) a test left running");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SIGKILLs every process whose command line names a path under `dir`
/// (a server's data directory, store or socket), and the process group each
/// leads apart from this one's (a keeper's services, whose command lines
/// name nothing: pg_auto_failover's); returns how many processes matched.
fn kill_processes_under(dir: &Path) -> usize {
    let needle = dir.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let own = std::process::id();
    let own_group = process_group(own);
    let mut matched = 0;
    let mut targets = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == own {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline.windows(needle.len()).any(|window| window == needle) {
            matched += 1;
            targets.push(pid.to_string());
            if let Some(group) = process_group(pid).filter(|group| Some(*group) != own_group) {
                targets.push(format!("-{group}"));
            }
        }
    }
    targets.sort();
    targets.dedup();
    inbox_test_servers::kill_quietly(&targets);
    matched
}

/// The process group of process `pid`.
fn process_group(pid: u32) -> Option<u32> {
    inbox_test_servers::parent_and_group(pid).map(|(_, group)| group)
}
