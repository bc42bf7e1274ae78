//! The runnable examples of the inbox crates; this library is empty.
//!
//! Run them from the workspace root:
//!
//! ```text
//! cargo run --example quickstart   # a payment consumer on embedded SQLite
//! cargo run --example migrations   # the app's and the inbox's migrations together
//! cargo run --example prune -- --help
//! DATABASE_URL=inbox.sqlite3 cargo run --example dead_letters -- summary
//! ```
