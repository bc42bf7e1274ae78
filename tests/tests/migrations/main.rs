//! The inbox's embedded migrations beside an application's own, on real
//! databases: PostgreSQL, MariaDB/MySQL and SQLite (`inbox_tests::TestBackend`).
//!
//! The application's migrations (`tests/migrations/app/`) have one version
//! older than every inbox migration and one newer, so the sets interleave.
//! Diesel's harness can only revert an applied version found in the source it
//! is given; `inbox_runtime::migrations::with_inbox` gives it both sets.
//! Nothing here counts the inbox's migrations: the expected versions are read
//! from the sources.
//!
//! Run: `cargo test -p inbox-tests --all-features --test migrations`

#![cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#![allow(missing_docs)]

mod partitioned;
mod support;
mod together;
