//! The compile-pass suite of `#[idempotent]`: every `pass/<group>/*.rs`
//! must compile and its `main` run. The cases are binaries of this package
//! (`[[bin]] ui-pass-<group>-<case>` in its manifest), built with its other
//! targets and run by [`pass_cases_run`]. (The compile-fail cases are the
//! package `inbox-compile-fail`'s, checked by trybuild there: with a pass
//! case among them, trybuild built every case alone, after a `cargo clean`.)
//!
//! A case's directory says which features it needs, and [`GROUPS`] runs a
//! directory exactly when they are all on, so a build with fewer backends
//! runs every case it can and skips no other:
//!
//! - `any/`: nothing (the attribute's own checks);
//! - `sqlite/`: the `sqlite` feature (SQLite handlers);
//! - `postgres_async/`: `postgres` and `async` (diesel-async on PostgreSQL);
//! - `all_backends/`: `sqlite`, `postgres` and `mysql` (the compiler's list
//!   of `Connection` implementations in the expected message names all
//!   three).
//! - `sqlite_serde/`: `sqlite` and `serde` (fingerprints of serde values,
//!   stored results); `postgres_async_serde/`: the same on async handlers;
//! - `sqlite_lapin/`, `sqlite_async_nats/`: `sqlite` and the broker client's
//!   feature (ids of the client's own types).
//!
//! A case added to an existing directory is picked up by its glob.

/// Each case directory, and whether this build has every feature it needs.
const GROUPS: &[(&str, bool)] = &[
    ("any", true),
    ("sqlite", cfg!(feature = "sqlite")),
    (
        "postgres_async",
        cfg!(all(feature = "postgres", feature = "async")),
    ),
    (
        "sqlite_serde",
        cfg!(all(feature = "sqlite", feature = "serde")),
    ),
    (
        "postgres_async_serde",
        cfg!(all(
            feature = "postgres",
            feature = "async",
            feature = "serde"
        )),
    ),
    (
        "sqlite_lapin",
        cfg!(all(feature = "sqlite", feature = "lapin")),
    ),
    (
        "sqlite_async_nats",
        cfg!(all(feature = "sqlite", feature = "async-nats")),
    ),
    (
        "all_backends",
        cfg!(all(
            feature = "sqlite",
            feature = "postgres",
            feature = "mysql"
        )),
    ),
];

use std::path::{Path, PathBuf};

/// The case directories under `tests/ui/<kind>/` whose features this build
/// has, by name.
fn enabled_groups(kind: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/ui")
        .join(kind);
    let mut groups = Vec::new();
    for entry in std::fs::read_dir(&root).expect("the case directories") {
        let group = entry.expect("a case directory").file_name();
        let group = group.to_str().expect("a UTF-8 directory name").to_owned();
        let enabled = GROUPS
            .iter()
            .find(|(name, _)| *name == group)
            .unwrap_or_else(|| panic!("tests/ui/{kind}/{group}/ is not in GROUPS"))
            .1;
        if enabled {
            groups.push(group);
        }
    }
    groups.sort();
    groups
}

/// Where cargo put this package's binaries: beside this test's `deps`
/// directory.
fn binaries_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_owned()
}

#[test]
fn pass_cases_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui/pass");
    let bin_dir = binaries_dir();
    let mut ran = 0;
    for group in enabled_groups("pass") {
        let mut cases: Vec<PathBuf> = std::fs::read_dir(root.join(&group))
            .expect("a case directory")
            .map(|entry| entry.expect("a case").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
            .collect();
        cases.sort();
        for case in cases {
            let stem = case
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("a case name");
            let binary = bin_dir.join(format!("ui-pass-{group}-{stem}"));
            assert!(
                binary.is_file(),
                "{} has no binary at {}: give it a `[[bin]]` entry in tests/Cargo.toml \
                 (name `ui-pass-{group}-{stem}`, its group's features)",
                case.display(),
                binary.display()
            );
            let output = std::process::Command::new(&binary)
                .output()
                .unwrap_or_else(|e| panic!("run {}: {e}", binary.display()));
            assert!(
                output.status.success(),
                "{}: {}\n{}{}",
                case.display(),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            ran += 1;
        }
    }
    assert!(ran > 0 || !cfg!(feature = "sqlite"), "no pass case ran");
}
