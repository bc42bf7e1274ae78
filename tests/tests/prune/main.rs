//! Retention and pruning against real databases: PostgreSQL, MariaDB/MySQL
//! and SQLite (see `inbox_tests`). Each test is a function generic over the
//! backend, instantiated per backend by `inbox_tests::backend_tests!`: test
//! names read `<module>::<backend>::<test>`.
//!
//! - `window`: rows inside the window stay, rows outside go, on every backend,
//!   by batches, per handler scope;
//! - `open_transactions`: ids held by a transaction still open are never
//!   removed, and the pruner does not wait for them;
//! - `concurrent`: pruners running while handlers claim new ids (PostgreSQL,
//!   MariaDB): no errors, no deadlocks, no in-window row lost;
//! - `background`: the pruning thread stops on its handle, survives the
//!   database going away (a TCP proxy cut, and killed backends), and backs
//!   off instead of spinning on persistent failures;
//! - `task`: the same for the pruning task on tokio over diesel-async pools
//!   (deadpool, bb8), which also waits for its run in flight when stopped;
//! - `batch_bounds`: a batch reads and locks no more rows than it deletes,
//!   one handler's batch and the default pass beside a handler whose own
//!   window keeps a large backlog (EXPLAIN ANALYZE and lock probes of every
//!   batch of a run);
//! - `schema`: `setup()` and the migrations make the same schema, and
//!   upgrade an inbox of the first version (its ids kept);
//! - `partitioned`: PostgreSQL's generation layout: duplicates across
//!   generations, expired generations dropped, rotation under concurrency,
//!   open transactions, its migrations; and on PostgreSQL a claim late in a
//!   long transaction is dated by its statement;
//! - `policy`: bad policies are rejected with clear errors;
//! - `asynchronous`: the same pruning on diesel-async connections.
//!
//! `window` also covers the longest window (`MAX_RETENTION`) and fractions of
//! a second; `partitioned` races claims against rotations deterministically
//! (READ COMMITTED and REPEATABLE READ); `asynchronous` covers open
//! transactions in the async run too.
//!
//! Rows are backdated by writing `received_at` directly: the tests never
//! sleep for a retention window. No assertion depends on timing.
//!
//! Run: `cargo test -p inbox-tests --all-features --test prune`

#![allow(missing_docs)]

mod support;

mod asynchronous;
mod background;
mod batch_bounds;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod concurrent;
#[cfg(feature = "postgres")]
mod lost_statements;
mod open_transactions;
mod partitioned;
mod policy;
mod schema;
mod task;
mod window;
