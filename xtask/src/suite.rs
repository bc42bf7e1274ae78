//! The cargo commands that run the test suite.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::backend::Backend;
use crate::phases;

/// The package that holds the end-to-end suites and the test-database support.
const TEST_PACKAGE: &str = "inbox-tests";
/// The library under test, run with the chosen backends' features alone.
const RUNTIME_PACKAGE: &str = "inbox-runtime";
/// Set for the suite: a server that cannot be reached fails its tests.
const REQUIRE_DATABASES: &str = "INBOX_REQUIRE_DATABASES";
/// Set for the suite: the tests on brokers (`tests/tests/brokers/`, the
/// outbox's publishers, `tests/tests/outbox_hop/`) fail when RabbitMQ or
/// NATS cannot be reached (xtask starts throwaway ones, see
/// [`crate::servers`]).
const REQUIRE_BROKERS: &str = "INBOX_TEST_REQUIRE_BROKERS";

/// Cargo's switch for incremental compilation of the workspace's crates.
const INCREMENTAL: &str = "CARGO_INCREMENTAL";

/// The incremental compilation of the whole suite's run: off, unless the
/// caller chose (`CARGO_INCREMENTAL` set). That run builds every target
/// once and runs it; the caches incremental compilation writes beside each
/// crate would only cost time and disk (measured in CONTRIBUTING.md, "What
/// a full run costs"). The quick loops, a few suites or one backend, keep
/// cargo's default.
fn one_shot_incremental() -> Option<&'static str> {
    match std::env::var_os(INCREMENTAL) {
        Some(_) => None,
        None => Some("0"),
    }
}

/// Runs the suite for `backends` with `environment` set and `cargo_args`
/// appended; returns cargo's exit code (128 + the signal when one ended it).
/// The whole suite without arguments runs in phases (see [`phases`]).
pub fn run(
    backends: &[Backend],
    cargo_args: &[String],
    environment: &[(String, String)],
) -> Result<u8, String> {
    let configured = |mut command: Command| {
        command
            .current_dir(workspace_root())
            .env(REQUIRE_DATABASES, "1")
            .env(REQUIRE_BROKERS, "1")
            .envs(environment.iter().map(|(name, value)| (name, value)));
        command
    };
    let started = Instant::now();
    let code = if Backend::whole_suite(backends) && cargo_args.is_empty() {
        let incremental = one_shot_incremental();
        phases::run(&workspace_root(), || {
            let mut command = configured(cargo());
            command.arg("test");
            if let Some(value) = incremental {
                command.env(INCREMENTAL, value);
            }
            command
        })?
    } else {
        let mut command = configured(cargo_test(backends, selects_targets(cargo_args)));
        command.args(cargo_args);
        phases::status(&mut command)?
    };
    eprintln!(
        "xtask: the suite took {:.1} s (exit code {code})",
        started.elapsed().as_secs_f64()
    );
    Ok(code)
}

/// `cargo test` for `backends`: the whole workspace with every feature, or,
/// for some backends only, the runtime and the suite with their features,
/// and then, unless `targets_chosen`, only their test targets (`--tests`:
/// libraries and integration tests; the examples need SQLite, and the
/// doctests every feature, which the whole run has).
fn cargo_test(backends: &[Backend], targets_chosen: bool) -> Command {
    let mut command = cargo();
    command.arg("test");
    if Backend::whole_suite(backends) {
        command.args(["--workspace", "--all-features"]);
    } else {
        let features: Vec<String> = backends
            .iter()
            .flat_map(|b| [RUNTIME_PACKAGE, TEST_PACKAGE].map(|p| format!("{p}/{}", b.feature())))
            .collect();
        command
            .args(["--package", RUNTIME_PACKAGE, "--package", TEST_PACKAGE])
            .args(["--no-default-features", "--features"])
            .arg(features.join(","));
        if !targets_chosen {
            command.arg("--tests");
        }
    }
    command
}

/// Whether `cargo_args` choose the targets themselves (`--test e2e`, `--doc`, …).
fn selects_targets(cargo_args: &[String]) -> bool {
    const TARGET_FLAGS: [&str; 11] = [
        "--lib",
        "--bin",
        "--bins",
        "--example",
        "--examples",
        "--test",
        "--tests",
        "--bench",
        "--benches",
        "--all-targets",
        "--doc",
    ];
    cargo_args.iter().take_while(|arg| *arg != "--").any(|arg| {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag);
        TARGET_FLAGS.contains(&flag)
    })
}

/// The cargo that runs `cargo xtask`, with the variables it set for this
/// binary removed (the nested cargo then sees the caller's environment).
fn cargo() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if name.starts_with("CARGO_PKG_")
            || matches!(
                name,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
            )
        {
            command.env_remove(name);
        }
    }
    command
}

/// The workspace root, above this package.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(backends: &[Backend]) -> Vec<String> {
        cargo_test(backends, false)
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn every_backend_is_the_whole_workspace() {
        assert_eq!(
            args(&Backend::ALL),
            ["test", "--workspace", "--all-features"]
        );
    }

    #[test]
    fn one_backend_is_the_runtime_and_the_suite_with_its_feature() {
        assert_eq!(
            args(&[Backend::Mysql]),
            [
                "test",
                "--package",
                RUNTIME_PACKAGE,
                "--package",
                TEST_PACKAGE,
                "--no-default-features",
                "--features",
                &format!("{RUNTIME_PACKAGE}/mysql,{TEST_PACKAGE}/mysql"),
                "--tests",
            ]
        );
    }

    #[test]
    fn chosen_targets_replace_the_test_targets() {
        let chosen =
            |line: &str| selects_targets(&line.split(' ').map(str::to_owned).collect::<Vec<_>>());
        assert!(chosen("--test e2e"));
        assert!(chosen("--test=e2e"));
        assert!(!chosen("some_filter -- --test-threads 1"));
    }
}
