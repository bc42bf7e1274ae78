//! When the consumer's connection goes away (issue 15, item 2b), against the
//! real PostgreSQL and MariaDB servers of the suite, blocking and async:
//!
//! - the handler's own connection terminated (`pg_terminate_backend`,
//!   `KILL`) mid-body and between the body's last statement and `COMMIT`:
//!   nothing half-committed, the caller's error says `Reconnect` (never
//!   `Retry`: retrying on that connection fails for ever), later work on the
//!   connection fails at once, and the redelivery on a new connection
//!   processes exactly once (`blocking.rs`, `asynchronous.rs`);
//! - pools never hand the dead connection back: r2d2 (`has_broken`, with
//!   and without `test_on_check_out`), deadpool (recycling `Fast` and
//!   `Verified`), bb8 (`has_broken`, with and without `test_on_check_out`);
//! - the classification of each server error, produced for real
//!   (`classify_postgres.rs`, `classify_mysql.rs`): the tables they print
//!   show what each driver said and what `recovery()` answered.
//!
//! Run: `cargo test -p inbox-tests --all-features --test connection_loss -- --nocapture`

#![allow(missing_docs)]

#[path = "connection_loss/support.rs"]
mod support;
#[macro_use]
#[path = "connection_loss/blocking.rs"]
mod blocking;
#[cfg(feature = "async")]
#[macro_use]
#[path = "connection_loss/asynchronous.rs"]
mod asynchronous;

#[cfg(feature = "mysql")]
#[path = "connection_loss/classify_mysql.rs"]
mod classify_mysql;
#[cfg(feature = "postgres")]
#[path = "connection_loss/classify_postgres.rs"]
mod classify_postgres;

#[cfg(feature = "postgres")]
mod postgres {
    pub const BACKEND: &str = "postgres";
    pub const CONNECTION_ID_SQL: &str = "pg_backend_pid()::bigint";

    /// Ends server connection `id`, waiting up to 5 s until it is gone.
    pub fn kill_sql(id: i64) -> String {
        format!("SELECT pg_terminate_backend({id}, 5000)")
    }

    /// Whether the server still lists connection `id` (0 or 1).
    pub fn alive_sql(id: i64) -> String {
        format!("(SELECT count(*) FROM pg_stat_activity WHERE pid = {id})")
    }

    mod blocking {
        use super::*;
        type Conn = diesel::PgConnection;
        type Db = inbox_tests::Postgres;
        blocking_loss_tests!();
    }

    #[cfg(feature = "async")]
    mod asynchronous {
        use super::*;
        type Conn = diesel_async::AsyncPgConnection;
        type Db = inbox_tests::Postgres;
        async_loss_tests!();
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    pub const BACKEND: &str = "mysql";
    pub const CONNECTION_ID_SQL: &str = "CAST(CONNECTION_ID() AS SIGNED)";

    /// Ends server connection `id`.
    pub fn kill_sql(id: i64) -> String {
        format!("KILL {id}")
    }

    /// Whether the server still lists connection `id` (0 or 1).
    pub fn alive_sql(id: i64) -> String {
        format!("(SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE id = {id})")
    }

    mod blocking {
        use super::*;
        type Conn = diesel::MysqlConnection;
        type Db = inbox_tests::Mysql;
        blocking_loss_tests!();
    }

    #[cfg(feature = "async")]
    mod asynchronous {
        use super::*;
        type Conn = diesel_async::AsyncMysqlConnection;
        type Db = inbox_tests::Mysql;
        async_loss_tests!();
    }
}
