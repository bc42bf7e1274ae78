//! Retention and pruning against real databases: PostgreSQL, MariaDB/MySQL
//! and SQLite (see `inbox_tests::testdb`).
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
//!   upgrade an inbox of the first version (its ids kept); on PostgreSQL a
//!   claim late in a long transaction is dated by its statement;
//! - `partitioned`: PostgreSQL's generation layout: duplicates across
//!   generations, expired generations dropped, rotation under concurrency;
//! - `policy`: bad policies are rejected with clear errors;
//! - `asynchronous`: the same pruning on diesel-async connections.
//!
//! `window` also covers the longest window (`MAX_RETENTION`) and fractions of
//! a second; `partitioned` races claims against rotations deterministically
//! (READ COMMITTED and REPEATABLE READ); `open_transactions` covers the
//! async run and the generation layout too.
//!
//! Rows are backdated by writing `received_at` directly: the tests never
//! sleep for a retention window. No assertion depends on timing.
//!
//! Run: `cargo test -p inbox-tests --all-features --test prune`

#![allow(missing_docs)]

#[path = "prune/common.rs"]
mod common;
#[path = "prune/proxy.rs"]
mod proxy;

#[path = "prune/asynchronous.rs"]
mod asynchronous;
#[path = "prune/background.rs"]
mod background;
#[path = "prune/batch_bounds.rs"]
mod batch_bounds;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[path = "prune/concurrent.rs"]
mod concurrent;
#[path = "prune/open_transactions.rs"]
mod open_transactions;
#[path = "prune/partitioned.rs"]
mod partitioned;
#[path = "prune/policy.rs"]
mod policy;
#[path = "prune/schema.rs"]
mod schema;
#[path = "prune/task.rs"]
mod task;
#[path = "prune/window.rs"]
mod window;
