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
//! ```
//!
//! The `brokers` module is the ledger consumer of the last two (and of the chaos
//! tests in `inbox-tests`).

#[cfg(feature = "brokers")]
pub mod brokers;
