//! What the runtime reports (features `tracing` and `metrics`), captured
//! from real deliveries on SQLite and PostgreSQL: the `inbox.process` span
//! of every delivery with its fields, the events (dead-lettering, database
//! errors, claim retries, pruning, outbox refusals), and the metrics,
//! counter by counter (deliveries, pruning, the outbox relay's rounds).
//! Spans and events go to a collecting `tracing-subscriber` layer, metrics
//! to metrics-util's `DebuggingRecorder`, both installed for the test's own
//! thread, so parallel tests never mix.
//!
//! Run: `cargo test -p inbox-tests --features postgres,async,tracing,metrics --test observability`
#![allow(missing_docs)]

mod capture;
mod delivery;
mod handlers;
mod outbox;
#[cfg(feature = "postgres")]
mod postgres_only;
mod prune;
mod schema;
