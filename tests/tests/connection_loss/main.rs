//! When the consumer's connection goes away (issue 15, item 2b), against the
//! real PostgreSQL and MariaDB servers of the suite, blocking and async:
//!
//! - the handler's own connection terminated (`pg_terminate_backend`,
//!   `KILL`) mid-body and between the body's last statement and `COMMIT`:
//!   nothing half-committed, the caller's error says `Reconnect` (never
//!   `Retry`: retrying on that connection fails for ever), later work on the
//!   connection fails at once, and the redelivery on a new connection
//!   processes exactly once (`blocking.rs`, `asynchronous.rs`, generic over the server backend);
//! - pools never hand the dead connection back: r2d2 (`has_broken`, with
//!   and without `test_on_check_out`), deadpool (recycling `Fast` and
//!   `Verified`), bb8 (`has_broken`, with and without `test_on_check_out`);
//! - the classification of each server error, produced for real
//!   (`classify/postgres.rs`, `classify/mysql.rs`): the tables they print
//!   show what each driver said and what `recovery()` answered.
//!
//! Run: `cargo test -p inbox-tests --all-features --test connection_loss -- --nocapture`

#![cfg(any(feature = "postgres", feature = "mysql"))]
#![allow(missing_docs)]

mod support;

#[cfg(feature = "async")]
mod asynchronous;
mod blocking;

mod classify;
