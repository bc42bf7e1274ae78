//! Recovery without a process restart (issue 15, items 2a and 2c), on
//! PostgreSQL servers the tests start and stop themselves
//! (`inbox_tests::PgServer`), never the shared one:
//!
//! - `restart`: the server restarted in immediate mode under a running
//!   consumer (a `PgConnection`, an r2d2 pool, an `AsyncPgConnection`, a
//!   deadpool and a bb8 pool) → it resumes by itself, nothing lost or
//!   doubled; the pools never hand out a connection that died while idle;
//! - `read_only`: a read-only server (25006) → the handler's error says
//!   `Reconnect`; a multi-host URL with `target_session_attrs=read-write`
//!   (libpq, tokio-postgres) → the consumer reaches the writable server;
//! - `failover` (issue 12): a primary and its streaming standby
//!   (synchronous, asynchronous), the primary killed and the standby
//!   promoted under a running consumer → with synchronous replication every
//!   acknowledged claim survives; with asynchronous replication claims are
//!   lost only with their effects, and the window is printed; a standby's
//!   refusal and a demoted primary's say `Reconnect`; and (issue 28) a
//!   pg_auto_failover formation whose monitor promotes the secondary by
//!   itself after the primary's host is killed → nothing acknowledged lost.
//!
//! The consumer is the one the guide describes, written once in
//! `consumer.rs`: redeliver while the error's `recovery()` says
//! `Retry`, reconnect on `Reconnect`, both with a bounded backoff.
//!
//! Run: `cargo test -p inbox-tests --all-features --test reconnect -- --nocapture`
//! (the runs print their recovery times).
#![cfg(feature = "postgres")]
#![allow(missing_docs)]

mod app;
mod consumer;
mod failover;
mod read_only;
mod restart;
