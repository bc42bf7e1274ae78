//! Async handlers on diesel-async, against real PostgreSQL and MariaDB: the
//! blocking suite's behaviours, pooled connections (deadpool, bb8), a race of
//! tasks on a multi-threaded runtime, and cancellation at every await point.
//!
//! Every test is a generic function over the backend, run on each server
//! backend by `inbox_tests::backend_tests!`; a module per runtime the tests
//! need (the race and the lock waits run on a multi-threaded one).
//!
//! Run: `cargo test -p inbox-tests --all-features --test async_handlers -- --nocapture`
#![cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
#![allow(missing_docs)]

mod deadlock;
mod delivery;
mod failure;
#[cfg(feature = "mysql")]
mod folding;
mod handlers;
mod in_flight;
mod outgoing;
#[cfg(feature = "postgres")]
mod pipelining;
mod race;
mod roundtrips;
mod support;
mod waiters;
