//! The compile-pass and compile-fail suite of `#[idempotent]`.
//!
//! Every `pass/<group>/*.rs` must compile (and its `main` run); every
//! `fail/<group>/*.rs` must fail to compile with exactly the diagnostics in
//! the `.stderr` file next to it. After a deliberate change of a message,
//! regenerate them with
//! `TRYBUILD=overwrite cargo test -p inbox-tests --all-features --test ui`
//! and read the diff.
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

#[test]
fn ui() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui");
    let t = trybuild::TestCases::new();
    for kind in ["pass", "fail"] {
        for entry in std::fs::read_dir(root.join(kind)).expect("the case directories") {
            let group = entry.expect("a case directory").file_name();
            let group = group.to_str().expect("a UTF-8 directory name");
            let enabled = GROUPS
                .iter()
                .find(|(name, _)| *name == group)
                .unwrap_or_else(|| panic!("tests/ui/{kind}/{group}/ is not in GROUPS"))
                .1;
            if !enabled {
                continue;
            }
            let cases = format!("tests/ui/{kind}/{group}/*.rs");
            match kind {
                "pass" => t.pass(cases),
                _ => t.compile_fail(cases),
            }
        }
    }
}
