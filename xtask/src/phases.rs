//! The whole suite in phases, so that the two CPUs of a small machine are
//! both busy: the compile cases (`ui`: trybuild builds its own copy of the
//! dependencies, then every case, CPU-bound) run beside the suites that
//! mostly wait for their servers; the suites that time what real processes
//! do (kills, restarts, a cluster, the brokers' chaos) run after them, away
//! from the compilers, in lanes side by side ([`TIMED_LANES`]): each of
//! them spends most of its time waiting for servers and processes (a
//! failover, a node's rejoin, a broker's redelivery), little of it on a CPU.
//!
//! 1. `cargo test --workspace --all-features --no-run`: every target built;
//! 2. beside each other: `--test ui` (its output printed when it ends), and
//!    the libraries', binaries' (but the compile-pass cases) and every other
//!    suite's tests, in two lanes ([`SECOND_LANE_BESIDE`]);
//! 3. the timed suites, their lanes beside each other (one then runs the
//!    doctests), and beside them one more: the PostgreSQL tests of
//!    [`THROUGH_PGBOUNCER`] again, through the suite's PgBouncer (each
//!    lane's output printed when it ends).
//!
//! A phase that fails ends the run after it (the phase beside it is waited
//! for), as `cargo test` stops at the first failing target.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// The suites that check timings of real processes (chaos kills, broker
/// and server restarts, the Galera cluster, failovers), in lanes that run
/// side by side, each suite after the other in its lane. The two that use
/// the most CPU (the Galera cluster's three servers, the PostgreSQL
/// failovers' servers) are in different lanes; the two broker chaos suites
/// share a lane, so that they never share the brokers; the doctests
/// (compiling, mostly) follow the failovers ([`DOCTESTS_AFTER`]), so that
/// they compile while the other lanes end, not beside all of them (after
/// the brokers' chaos they did, and the run was no faster).
const TIMED_LANES: [&[&str]; 3] = [&["galera"], &["reconnect"], &["brokers", "outbox_hop"]];

/// Timed suites whose tests mostly wait (for servers of their own to
/// start, fail over, come back) and run with more test threads than the
/// machine has CPUs (`RUST_TEST_THREADS` for their lane): `reconnect`'s
/// tests took 57 s on 2 threads and 38 s on 4, alone on a 2-CPU machine,
/// with 15 s of CPU either way.
const MORE_THREADS: [(&str, &str); 1] = [("reconnect", "4")];

/// The suites beside the compile cases that run in a second lane, a cargo
/// of their own beside the first: about half of the suites' time (they
/// mostly wait for their servers), so that both lanes end with the
/// compile cases.
const SECOND_LANE_BESIDE: [&str; 5] = ["connection_loss", "http", "outbox", "poison", "prune"];

/// The lane of [`TIMED_LANES`] the doctests run at the end of.
const DOCTESTS_AFTER: usize = 1;

/// The suites whose PostgreSQL tests run a second time through PgBouncer's
/// transaction pooling, in a lane of their own beside the timed suites.
const THROUGH_PGBOUNCER: [&str; 4] = ["batch", "e2e", "poison", "prune"];

/// Where the suite's PgBouncer is (`crate::servers`).
const PGBOUNCER_URL: &str = crate::servers::PGBOUNCER_URL;

/// The binaries whose own tests run (`--bin`, a glob): every one but the
/// compile-pass cases (`ui-pass-*`, whose test harnesses would only be
/// compiled for nothing).
const PROGRAMS: &str = "[!u]*";

/// The compile cases: `--test ui` is both the suite of `inbox-tests` that
/// runs the compile-pass binaries and the trybuild suite of
/// `inbox-compile-fail`.
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

    let started = Instant::now();
    let code = status(&mut whole(&["--no-run"]))?;
    took("the build", started);
    if code != 0 {
        return Ok(code);
    }

    let cases = Captured::spawn(
        whole(&["--test", COMPILE_CASES]),
        format!("the compile cases (`--test {COMPILE_CASES}`), run beside the suites"),
    )?;
    let (first, second): (Vec<&String>, Vec<&String>) = beside
        .iter()
        .partition(|suite| !SECOND_LANE_BESIDE.contains(&suite.as_str()));
    let mut second_lane = whole(&[]);
    for suite in second {
        second_lane.args(["--test", suite]);
    }
    let second_lane = Captured::spawn(
        second_lane,
        format!("the suites {SECOND_LANE_BESIDE:?}, beside the others"),
    )?;
    let mut others = whole(&["--lib", "--bin", PROGRAMS]);
    for suite in first {
        others.args(["--test", suite]);
    }
    let started = Instant::now();
    let others_code = status(&mut others);
    took("the suites beside the compile cases", started);
    let second_code = second_lane.finish()?;
    let cases_code = cases.finish()?;
    if let Some(code) = [others_code?, second_code, cases_code]
        .into_iter()
        .find(|code| *code != 0)
    {
        return Ok(code);
    }

    let mut lanes: Vec<Vec<(Command, String)>> = timed
        .iter()
        .map(|lane| {
            let mut command = whole(&[]);
            for suite in lane {
                command.args(["--test", suite]);
                if let Some((_, threads)) = MORE_THREADS.iter().find(|(name, _)| name == suite) {
                    command.env("RUST_TEST_THREADS", threads);
                }
            }
            vec![(command, format!("the timed suites {lane:?}"))]
        })
        .collect();
    // The doctests (mostly compiling) after a lane's suites, which mostly
    // wait.
    lanes[DOCTESTS_AFTER].push((whole(&["--doc"]), "the doctests".to_owned()));
    if let Some(pass) = through_pgbouncer(&whole) {
        lanes.push(vec![pass]);
    }
    let started = Instant::now();
    let code = run_lanes(lanes);
    took("the timed suites' phase", started);
    code
}

/// The PostgreSQL tests of [`THROUGH_PGBOUNCER`] run again through the
/// suite's PgBouncer (transaction pooling; see `inbox_tests::behind_pgbouncer`),
/// when there is one (`INBOX_TEST_PGBOUNCER_URL`).
fn through_pgbouncer(whole: &impl Fn(&[&str]) -> Command) -> Option<(Command, String)> {
    let mut command = whole(&[]);
    let known = command
        .get_envs()
        .any(|(name, value)| name == PGBOUNCER_URL && value.is_some())
        || std::env::var_os(PGBOUNCER_URL).is_some();
    if !known {
        eprintln!("xtask: no PgBouncer ({PGBOUNCER_URL}): the suites do not run through one");
        return None;
    }
    for suite in THROUGH_PGBOUNCER {
        command.args(["--test", suite]);
    }
    command
        .env("INBOX_TEST_POSTGRES_THROUGH_PGBOUNCER", "1")
        .args(["--", "postgres::"]);
    Some((
        command,
        format!("the PostgreSQL tests of {THROUGH_PGBOUNCER:?} through PgBouncer"),
    ))
}

/// Says how long `what` took, from `started`.
fn took(what: &str, started: Instant) {
    eprintln!(
        "xtask: {what} took {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// Runs each lane's commands one after the other, the lanes side by side,
/// each lane's output held and printed when it ends (so that their lines do
/// not interleave); the exit code of the first command that failed, or 0.
fn run_lanes(lanes: Vec<Vec<(Command, String)>>) -> Result<u8, String> {
    let results: Vec<Result<u8, String>> = std::thread::scope(|scope| {
        let threads: Vec<_> = lanes
            .into_iter()
            .map(|lane| {
                scope.spawn(move || {
                    for (command, what) in lane {
                        let code = Captured::spawn(command, what)?.finish()?;
                        if code != 0 {
                            return Ok(code);
                        }
                    }
                    Ok(0)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err("a lane panicked".to_owned()))
            })
            .collect()
    });
    let mut first_failure = 0;
    for result in results {
        let code = result?;
        if first_failure == 0 {
            first_failure = code;
        }
    }
    Ok(first_failure)
}

/// A phase's command running beside another, its output held and printed
/// when it ends (so that two phases' lines do not interleave).
struct Captured {
    child: std::process::Child,
    what: String,
    started: Instant,
}

impl Captured {
    fn spawn(mut command: Command, what: String) -> Result<Self, String> {
        print(&command);
        let child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{command:?}: {e}"))?;
        Ok(Captured {
            child,
            what,
            started: Instant::now(),
        })
    }

    /// Waits for the end, prints the output; the exit code.
    fn finish(self) -> Result<u8, String> {
        let output = self
            .child
            .wait_with_output()
            .map_err(|e| format!("wait for {}: {e}", self.what))?;
        eprintln!(
            "xtask: {} (ended {:.0} s after it started):",
            self.what,
            self.started.elapsed().as_secs_f64()
        );
        eprint!("{}", String::from_utf8_lossy(&output.stdout));
        eprint!("{}", String::from_utf8_lossy(&output.stderr));
        Ok(exit_code(output.status))
    }
}

/// The suites beside the compile cases, and the timed ones by lane.
fn suites(root: &Path) -> Result<(Vec<String>, Vec<Vec<String>>), String> {
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
    let is_timed = |name: &str| TIMED_LANES.iter().any(|lane| lane.contains(&name));
    let (timed, beside): (Vec<String>, Vec<String>) = names
        .into_iter()
        .filter(|name| name != COMPILE_CASES)
        .partition(|name| is_timed(name));
    if timed.len() != TIMED_LANES.iter().map(|lane| lane.len()).sum::<usize>() {
        return Err(format!(
            "the timed suites {TIMED_LANES:?} are not all in {}",
            dir.display()
        ));
    }
    if let Some(missing) = SECOND_LANE_BESIDE
        .iter()
        .find(|suite| !beside.iter().any(|name| name == *suite))
    {
        return Err(format!("no suite `{missing}` in {}", dir.display()));
    }
    let lanes = TIMED_LANES
        .iter()
        .map(|lane| lane.iter().map(|suite| (*suite).to_owned()).collect())
        .collect();
    Ok((beside, lanes))
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
/// (`INBOX_…`, `RUST_TEST_THREADS`), not the servers' URLs' passwords.
fn print(command: &Command) {
    let variables: Vec<String> = command
        .get_envs()
        .filter_map(|(name, value)| Some((name.to_str()?, value?.to_str()?)))
        .filter(|(name, _)| {
            name.starts_with("INBOX_REQUIRE")
                || name.starts_with("INBOX_TEST_REQUIRE")
                || *name == "RUST_TEST_THREADS"
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

    /// `--bin` [`PROGRAMS`] picks every binary target of the workspace but
    /// the compile-pass cases.
    #[test]
    fn the_programs_are_every_binary_but_the_compile_pass_cases() {
        let output = Command::new(env!("CARGO"))
            .args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ])
            .output()
            .expect("cargo metadata");
        let metadata = String::from_utf8(output.stdout).expect("UTF-8 metadata");
        // Each binary target is `{"kind":["bin"],…,"name":"<name>"` in the
        // metadata's JSON.
        let bins: Vec<&str> = metadata
            .split("\"kind\":[\"bin\"]")
            .skip(1)
            .filter_map(|rest| rest.split("\"name\":\"").nth(1)?.split('"').next())
            .collect();
        assert!(bins.contains(&"xtask"), "{bins:?}");
        assert!(
            bins.iter().any(|bin| bin.starts_with("ui-pass-")),
            "{bins:?}"
        );
        for bin in bins {
            let picked = !bin.starts_with('u');
            assert_eq!(
                picked,
                !bin.starts_with("ui-pass-"),
                "{bin}: `--bin {PROGRAMS}` must pick every program and no compile-pass case"
            );
        }
    }

    #[test]
    fn every_suite_runs_in_one_phase() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let (beside, lanes) = suites(root).unwrap();
        assert_eq!(lanes, TIMED_LANES);
        assert!(beside.contains(&"e2e".to_owned()));
        assert!(!beside.iter().any(|suite| suite == COMPILE_CASES));
        let all = std::fs::read_dir(root.join(SUITES_DIR))
            .unwrap()
            .filter(|entry| entry.as_ref().unwrap().path().is_dir())
            .count();
        let timed: usize = lanes.iter().map(Vec::len).sum();
        assert_eq!(beside.len() + timed + 1, all, "no suite left out");
    }
}
