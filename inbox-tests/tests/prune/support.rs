//! Helpers shared by the pruning tests: backdating rows by the database
//! clock, seeding and reading the inbox, claiming ids.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::time::Duration;

use diesel::connection::{LoadConnection, SimpleConnection};
use diesel::prelude::*;
use inbox_runtime::{
    run_idempotent, ClaimKey, HandlerName, InboxBackend, InboxError, Outcome, RetentionPolicy,
};
pub use inbox_tests::TestBackend;

pub const HOUR: i64 = 3_600;
pub const DAY: i64 = 86_400;

/// Seconds as a `Duration`.
pub fn secs(seconds: i64) -> Duration {
    Duration::from_secs(seconds.unsigned_abs())
}

/// A policy from whole seconds; panics on a bad one (tests of bad policies
/// call `RetentionPolicy` directly).
pub fn policy(keep: i64, redelivery_window: i64) -> RetentionPolicy {
    RetentionPolicy::new(secs(keep), secs(redelivery_window)).expect("a valid policy")
}

pub fn handler(name: &str) -> HandlerName {
    HandlerName::new(name.to_owned()).expect("a valid handler name")
}

/// Message ids `{prefix}-0` … `{prefix}-{n-1}`.
pub fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// A test database whose connections the inbox supports, plus what differs
/// between backends in the tests themselves.
pub trait PruneDb: TestBackend<Connection: LoadConnection<Backend: InboxBackend>> {
    /// SQL for the database-clock time `seconds` ago, in the column's type.
    fn ago(seconds: i64) -> String;

    /// The message ids stored for `handler`.
    fn stored_ids(conn: &mut Self::Connection, handler: &str) -> BTreeSet<String>;

    /// Rows in the inbox.
    fn count(conn: &mut Self::Connection) -> i64;

    /// Effects recorded in `prune_ledger`, one message id per effect.
    fn ledger(conn: &mut Self::Connection) -> Vec<String>;

    /// The server URL (to route it through a proxy); `None` for SQLite.
    fn server_url(&self) -> Option<String>;
}

#[derive(QueryableByName)]
pub struct IdRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub message_id: String,
}

#[derive(QueryableByName)]
pub struct CountRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub n: i64,
}

macro_rules! prune_db {
    ($database:ty, $connection:ty, |$seconds:ident| $ago:expr, |$db:ident| $url:expr) => {
        impl PruneDb for $database {
            fn ago($seconds: i64) -> String {
                $ago
            }

            fn stored_ids(conn: &mut $connection, handler: &str) -> BTreeSet<String> {
                diesel::sql_query(format!(
                    "SELECT message_id FROM inbox_messages WHERE handler = '{handler}'"
                ))
                .load::<IdRow>(conn)
                .expect("read the inbox")
                .into_iter()
                .map(|row| row.message_id)
                .collect()
            }

            fn count(conn: &mut $connection) -> i64 {
                diesel::sql_query("SELECT COUNT(*) AS n FROM inbox_messages")
                    .get_result::<CountRow>(conn)
                    .expect("count the inbox")
                    .n
            }

            fn ledger(conn: &mut $connection) -> Vec<String> {
                diesel::sql_query("SELECT message_id FROM prune_ledger")
                    .load::<IdRow>(conn)
                    .expect("read the ledger")
                    .into_iter()
                    .map(|row| row.message_id)
                    .collect()
            }

            fn server_url(&self) -> Option<String> {
                let $db = self;
                $url
            }
        }
    };
}

#[cfg(feature = "postgres")]
prune_db!(
    inbox_tests::Postgres,
    diesel::PgConnection,
    |seconds| format!("now() - interval '{seconds} seconds'"),
    |db| Some(db.url().to_owned())
);
#[cfg(feature = "mysql")]
prune_db!(
    inbox_tests::Mysql,
    diesel::MysqlConnection,
    |seconds| format!("UTC_TIMESTAMP(6) - INTERVAL {seconds} SECOND"),
    |db| Some(db.url().to_owned())
);
#[cfg(feature = "sqlite")]
prune_db!(
    inbox_tests::Sqlite,
    diesel::SqliteConnection,
    |seconds| format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '-{seconds} seconds')"),
    |_db| None
);

/// Inserts `(handler, id)` rows received `ago` seconds ago (by the database
/// clock), or now.
pub fn seed<D: PruneDb>(conn: &mut D::Connection, handler: &str, ids: &[String], ago: Option<i64>) {
    for chunk in ids.chunks(500) {
        // SQLite has no `DEFAULT` in a VALUES list: leave the column out.
        let (column, at) = match ago {
            Some(seconds) => (", received_at", format!(", {}", D::ago(seconds))),
            None => ("", String::new()),
        };
        let values: Vec<String> = chunk
            .iter()
            .map(|id| format!("('{handler}', '{id}'{at})"))
            .collect();
        let sql = format!(
            "INSERT INTO inbox_messages (handler, message_id{column}) VALUES {}",
            values.join(", ")
        );
        conn.batch_execute(&sql).expect("seed the inbox");
    }
}

/// Moves `ids`' `received_at` to `ago` seconds ago.
pub fn backdate<D: PruneDb>(conn: &mut D::Connection, handler: &str, ids: &[String], ago: i64) {
    let list: Vec<String> = ids.iter().map(|id| format!("'{id}'")).collect();
    let sql = format!(
        "UPDATE inbox_messages SET received_at = {} WHERE handler = '{handler}' AND message_id IN ({})",
        D::ago(ago),
        list.join(", ")
    );
    conn.batch_execute(&sql).expect("backdate rows");
}

/// Delivers `id` to `handler` through the inbox (claim + effect in one
/// transaction); the effect is a row in `prune_ledger` when the table exists.
pub fn deliver<C>(
    conn: &mut C,
    handler_name: &str,
    id: &str,
    ledger: bool,
) -> Result<Outcome<()>, InboxError>
where
    C: Connection<Backend: InboxBackend>,
{
    let key = ClaimKey::new(handler(handler_name), id)?;
    run_idempotent(conn, key, |conn| {
        if ledger {
            conn.batch_execute(&format!(
                "INSERT INTO prune_ledger (message_id) VALUES ('{id}')"
            ))?;
        }
        Ok::<_, InboxError>(Outcome::Processed(()))
    })
}

/// The effects table for `deliver(.., ledger: true)`.
pub fn create_ledger<C: Connection>(conn: &mut C) {
    conn.batch_execute("CREATE TABLE prune_ledger (message_id VARCHAR(255) NOT NULL)")
        .expect("create the ledger");
}

/// Owned strings from a slice of ids, for set comparisons.
pub fn set(ids: &[String]) -> BTreeSet<String> {
    ids.iter().cloned().collect()
}
