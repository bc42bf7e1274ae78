//! End-to-end tests of `#[idempotent]` and the inbox runtime against real
//! databases: PostgreSQL, MariaDB/MySQL and SQLite.
//!
//! Every behaviour is written once (the `*_tests!` macros in `tests/e2e/`)
//! and expanded per backend by `backend_suite!`, so test names read
//! `postgres::delivery::processed_then_duplicate`,
//! `sqlite::concurrency::race_shuffled_orders`, etc. Each test gets
//! a database of its own from `inbox_tests::testdb`; a test whose server
//! cannot be reached prints `skipped:` and returns, unless
//! `INBOX_REQUIRE_DATABASES=1`.
//!
//! Run: `cargo test -p inbox-tests --all-features --test e2e -- --nocapture`
//! (the race tests print their figures).

#![allow(missing_docs)]

// The crate root is `tests/e2e.rs`, so its modules live in `tests/e2e/` by path.

#[macro_use]
#[path = "e2e/support.rs"]
mod support;
#[macro_use]
#[path = "e2e/handlers.rs"]
mod handlers;
#[macro_use]
#[path = "e2e/delivery.rs"]
mod delivery;
#[macro_use]
#[path = "e2e/nesting.rs"]
mod nesting;
#[macro_use]
#[path = "e2e/failure.rs"]
mod failure;
#[macro_use]
#[path = "e2e/server_faults.rs"]
mod server_faults;
#[macro_use]
#[path = "e2e/ids.rs"]
mod ids;
#[macro_use]
#[path = "e2e/api.rs"]
mod api;
#[macro_use]
#[path = "e2e/concurrency.rs"]
mod concurrency;
#[macro_use]
#[path = "e2e/suite.rs"]
mod suite;
#[path = "e2e/dialect.rs"]
mod dialect;

#[cfg(feature = "postgres")]
backend_suite!(postgres, inbox_tests::Postgres, crate::dialect::postgres);
#[cfg(feature = "mysql")]
backend_suite!(mysql, inbox_tests::Mysql, crate::dialect::mysql);
#[cfg(feature = "sqlite")]
backend_suite!(sqlite, inbox_tests::Sqlite, crate::dialect::sqlite);

#[cfg(feature = "postgres")]
#[path = "e2e/fault.rs"]
mod fault;

#[cfg(feature = "postgres")]
mod postgres_faults {
    use crate::postgres::*;
    server_fault_tests!();
}

#[cfg(feature = "mysql")]
mod mysql_faults {
    use crate::mysql::*;
    server_fault_tests!();
}
