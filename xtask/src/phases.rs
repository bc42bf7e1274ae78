//! The whole suite in phases, so that the two CPUs of a small machine are
//! both busy: the compile cases (`ui`: trybuild builds its own copy of the
//! dependencies, then every case, CPU-bound) run beside the suites that
//! mostly wait for their servers; the suites that time what real processes
//! do (kills, restarts, a cluster, the brokers' chaos) run after them, with
//! the machine to themselves.
//!
//! 1. `cargo test --workspace --all-features --no-run`: every target built;
//! 2. beside each other: `--test ui` (its output printed when it ends), and
//!    the libraries', binaries' and every other suite's tests, then the
//!    doctests;
//! 3. the timed suites ([`TIMED_SUITES`]).
//!
//! A phase that fails ends the run after it (the phase beside it is waited
//! for), as `cargo test` stops at the first failing target.

use std::path::Path;
use std::process::{Command, Stdio};

/// The suites that check timings of real processes (chaos kills, broker
/// and server restarts, the Galera cluster, failovers): run with the
/// machine to themselves.
const TIMED_SUITES: [&str; 4] = ["brokers", "galera", "outbox_hop", "reconnect"];

/// The compile-pass and compile-fail cases (trybuild).
const COMPILE_CASES: &str = "ui";

/// Where the suites are: one directory per suite, `tests/tests/<name>/main.rs`.
const SUITES_DIR: &str = "tests/tests";

/// Runs the phases with `cargo` (a command that says `cargo test`,
/// configured with the environment and directory); returns the exit code of
/// the first phase that failed, or 0.
pub fn run(root: &Path, cargo: impl Fn() -> Command) -> Result<u8, String> {
    let (beside, timed) = suites(root)?;
    let whole = |extra: &[&str]| {
        let mut command = cargo();
        command.args(["--workspace", "--all-features"]).args(extra);
        command
    };

    let code = status(&mut whole(&["--no-run"]))?;
    if code != 0 {
        return Ok(code);
    }

    let mut cases = whole(&["--test", COMPILE_CASES]);
    print(&cases);
    let cases = cases
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cases:?}: {e}"))?;
    let mut others = whole(&["--lib", "--bins"]);
    for suite in &beside {
        others.args(["--test", suite]);
    }
    let others_code = status(&mut others).and_then(|code| match code {
        0 => status(&mut whole(&["--doc"])),
        failed => Ok(failed),
    });
    let cases = cases
        .wait_with_output()
        .map_err(|e| format!("wait for the compile cases: {e}"))?;
    eprintln!("xtask: the compile cases (`--test {COMPILE_CASES}`), run beside the suites:");
    eprint!("{}", String::from_utf8_lossy(&cases.stdout));
    eprint!("{}", String::from_utf8_lossy(&cases.stderr));
    let cases_code = exit_code(cases.status);
    match (others_code?, cases_code) {
        (0, 0) => {}
        (0, code) | (code, _) => return Ok(code),
    }

    let mut timed_run = whole(&[]);
    for suite in &timed {
        timed_run.args(["--test", suite]);
    }
    status(&mut timed_run)
}

/// The suites beside the compile cases, and the timed ones, by name.
fn suites(root: &Path) -> Result<(Vec<String>, Vec<String>), String> {
    let dir = root.join(SUITES_DIR);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("list {}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .filter(|entry| entry.path().join("main.rs").is_file())
        .filter_map(|entry| entry.file_name().to_str().map(str::to_owned))
        .collect();
    names.sort();
    if !names.iter().any(|name| name == COMPILE_CASES) {
        return Err(format!("no suite `{COMPILE_CASES}` in {}", dir.display()));
    }
    let (timed, beside): (Vec<String>, Vec<String>) = names
        .into_iter()
        .filter(|name| name != COMPILE_CASES)
        .partition(|name| TIMED_SUITES.contains(&name.as_str()));
    if timed.len() != TIMED_SUITES.len() {
        return Err(format!(
            "the timed suites {TIMED_SUITES:?} are not all in {}",
            dir.display()
        ));
    }
    Ok((beside, timed))
}

/// Runs `command` to its end, printed first with the suite's variables;
/// its exit code (128 + the signal that ended it).
pub fn status(command: &mut Command) -> Result<u8, String> {
    print(command);
    command
        .status()
        .map(exit_code)
        .map_err(|e| format!("{command:?}: {e}"))
}

/// Prints `command` as a shell line, with the variables the suite reads
/// (`INBOX_…`), not the servers' URLs' passwords.
fn print(command: &Command) {
    let variables: Vec<String> = command
        .get_envs()
        .filter_map(|(name, value)| Some((name.to_str()?, value?.to_str()?)))
        .filter(|(name, _)| {
            name.starts_with("INBOX_REQUIRE") || name.starts_with("INBOX_TEST_REQUIRE")
        })
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    let args: Vec<String> = command
        .get_args()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    eprintln!("xtask: {} cargo {}", variables.join(" "), args.join(" "));
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_suite_runs_in_one_phase() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let (beside, timed) = suites(root).unwrap();
        assert_eq!(timed, TIMED_SUITES);
        assert!(beside.contains(&"e2e".to_owned()));
        assert!(!beside.iter().any(|suite| suite == COMPILE_CASES));
        let all = std::fs::read_dir(root.join(SUITES_DIR))
            .unwrap()
            .filter(|entry| entry.as_ref().unwrap().path().is_dir())
            .count();
        assert_eq!(beside.len() + timed.len() + 1, all, "no suite left out");
    }
}
