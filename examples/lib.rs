//! The runnable examples of the inbox crates, and (feature `brokers`) the
//! ledger consumer they share on real brokers.
//!
//! Run them from the workspace root:
//!
//! ```text
//! cargo run --example quickstart   # a payment consumer on embedded SQLite
//! cargo run --example migrations   # the app's and the inbox's migrations together
//! cargo run --example prune -- --help
//! DATABASE_URL=inbox.sqlite3 cargo run --example dead_letters -- summary
//! cargo run --example rabbitmq --features brokers   # a ledger consumer on RabbitMQ and PostgreSQL
//! cargo run --example nats --features brokers       # the same on NATS JetStream
//! cargo run --example http_idempotency --features http   # POST /payments with Idempotency-Key
//! ```
//!
//! The `brokers` module is the ledger consumer of the rabbitmq and nats
//! examples (and of the chaos tests in `inbox-tests`); the `http` module is
//! the HTTP service of `http_idempotency` (and of the HTTP suite in
//! `inbox-tests`).

#[cfg(feature = "brokers")]
pub mod brokers;
#[cfg(feature = "http")]
pub mod http;
