//! The compile-pass and compile-fail suite of `#[idempotent]`.
//!
//! `tests/ui/pass/*.rs` must compile (and their `main` run); every
//! `tests/ui/fail/*.rs` must fail to compile with exactly the diagnostics in
//! the `.stderr` file next to it. After a deliberate change of a message,
//! regenerate them with
//! `TRYBUILD=overwrite cargo test -p inbox-tests --all-features --test ui`
//! and read the diff.
//!
//! The cases use every backend (SQLite handlers, diesel-async on PostgreSQL,
//! and the compiler's lists of `Connection` implementations in the expected
//! messages name all three), so the suite runs with all of them enabled, as
//! `--all-features` does, and is skipped otherwise.

#![cfg(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "async"
))]

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
