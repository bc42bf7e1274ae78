//! `run_idempotent_batch` against real databases (PostgreSQL, MariaDB/MySQL
//! and a SQLite file): new ids processed and redeliveries skipped, results
//! in input order, copies and invalid ids inside a batch (`basics`);
//! batches longer than `MAX_BATCH_MESSAGES` and than a claim statement's
//! bound, and the statements a batch sends (`sizes`); batches mixing ids
//! claimed before and new ones, which MariaDB/MySQL claims id by id
//! (`mixed`); threads delivering overlapping, shuffled batches, and single
//! deliveries among them (`concurrency`); a failing body split off from
//! the rest of its batch, counted only when it fails alone, up to dead and
//! rejected (`failures`); panics (`panics`); a killed connection, a lock
//! conflict and a deadlock in bodies (`trouble`); a commit that fails
//! (`commit`); a batch inside the caller's transaction (`nested`); an
//! `#[idempotent]` function as a batch's body (`handlers`); one body for
//! all the new messages (`bulk`); PostgreSQL's
//! generation layout (`partitioned`); and `run_idempotent_batch_async` on
//! diesel-async connections (`asynchronous`).
//!
//! Every behaviour is a generic function over the backend, instantiated by
//! `inbox_tests::backend_tests!`, so names read
//! `failures::mysql::a_failure_in_the_middle_spares_the_others`. Each test
//! gets a database of its own from the harness; the bodies write one
//! `batch_effects` row per effect (no unique key: an effect applied twice
//! shows), and the races increment one `batch_counters` row per id.
//!
//! Run: `INBOX_REQUIRE_DATABASES=1 cargo test -p inbox-tests --all-features --test batch`
//! (`-- --nocapture` shows the race figures).

#![allow(missing_docs)]

mod support;

#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
mod asynchronous;
mod basics;
mod bulk;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod commit;
mod concurrency;
mod failures;
mod handlers;
mod mixed;
mod nested;
mod panics;
#[cfg(feature = "postgres")]
mod partitioned;
mod sizes;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod trouble;
