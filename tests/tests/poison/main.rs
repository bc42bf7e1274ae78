//! Poison messages against real databases: failed attempts counted across
//! the rollback, the limit and the dead state, rejections, panics at every
//! depth, what is not counted (database trouble, nested handlers), races of
//! deliveries, the operator surface (`dead_letters`), an inbox created
//! before `inbox_failures` existed, and `ack_decision` end to end.
//!
//! Every behaviour is a generic function over the backend, instantiated by
//! `inbox_tests::backend_tests!` on PostgreSQL, MariaDB/MySQL and SQLite
//! (blocking) and on PostgreSQL and MariaDB/MySQL (diesel-async), so names
//! read `limit::postgres::the_third_failure_is_fatal`.
//!
//! The process-wide default limit (`set_default_max_attempts`) is read only
//! by handlers without a limit of their own: in this binary those are the
//! `defaulted` handlers, used only by `default_limit`, whose tests hold one
//! lock while they change the default. Every other handler names its limit.
//!
//! Run: `cargo test -p inbox-tests --features sqlite,postgres,mysql,async --test poison`

#![allow(missing_docs)]

mod support;

mod handlers;
#[cfg(feature = "async")]
mod handlers_async;

mod ack;
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
mod asynchronous;
mod concurrency;
mod counting;
mod dead_letters;
mod default_limit;
#[cfg(feature = "postgres")]
mod encoding;
mod not_counted;
mod panics;
mod pruning;
mod refused_commit;
mod rejection;
mod schema;
