//! Payload fingerprints and stored results against real databases: the
//! same id with the same payload is a duplicate, with another payload a
//! `Conflict` that runs nothing and dead-letters; racing copies with
//! different payloads run exactly one body; a stored result is replayed to
//! duplicates, an oversized one rolls its delivery back; claims made without
//! a fingerprint or a result (older handlers, an inbox from before the
//! columns) keep working; the generation layout keeps both in its archive;
//! the async handlers behave the same.
//!
//! Every behaviour is a generic function over the backend, instantiated by
//! `inbox_tests::backend_tests!` on PostgreSQL, MariaDB/MySQL and SQLite.
//!
//! Run: `cargo test -p inbox-tests --features sqlite,postgres,mysql,async,serde --test payloads`

#![allow(missing_docs)]

mod support;

mod handlers;
#[cfg(feature = "async")]
mod handlers_async;

#[cfg(feature = "async")]
mod asynchronous;
mod fingerprints;
#[cfg(feature = "postgres")]
mod partitioned;
mod prepared;
mod races;
mod schema;
mod stored;
