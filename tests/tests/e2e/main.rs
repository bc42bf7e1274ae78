//! End-to-end tests of `#[idempotent]` and the inbox runtime against real
//! databases: PostgreSQL, MariaDB/MySQL and SQLite.
//!
//! Every behaviour is an ordinary generic function over the backend
//! (`fn processed_then_duplicate<B: E2e>()`), instantiated per backend by
//! `inbox_tests::backend_tests!`, so test names read
//! `delivery::postgres::processed_then_duplicate`,
//! `concurrency::sqlite::race_shuffled_orders`, etc. The handlers under test
//! (`handlers.rs`) are generic over the connection. Each test gets a
//! database of its own from the harness; a test whose server cannot be
//! reached prints `skipped:` and returns, unless `INBOX_REQUIRE_DATABASES=1`.
//!
//! Run: `cargo test -p inbox-tests --all-features --test e2e -- --nocapture`
//! (the race tests print their figures).

#![allow(missing_docs)]

mod support;

mod handlers;

mod api;
mod concurrency;
mod delivery;
mod failure;
#[cfg(feature = "postgres")]
mod fault;
mod ids;
mod in_flight;
mod nesting;
mod roundtrips;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod server_faults;
mod statements;
