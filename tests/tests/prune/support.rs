//! Helpers shared by the pruning tests: backdating rows by the database
//! clock, seeding and reading the inbox, claiming ids.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_runtime::{
    ClaimKey, HandlerName, InboxBackend, InboxError, Outcome, RetentionPolicy, run_idempotent,
};
pub use inbox_tests::{ServerBackend, SqlRows, TestBackend};

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

/// The message ids stored for `handler`.
pub fn stored_ids(conn: &mut impl SqlRows, handler: &str) -> BTreeSet<String> {
    conn.texts(&format!(
        "SELECT message_id AS value FROM inbox_messages WHERE handler = '{handler}'"
    ))
    .into_iter()
    .collect()
}

/// Rows in the inbox.
pub fn count(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages")
}

/// Effects recorded in `prune_ledger`, one message id per effect.
pub fn ledger(conn: &mut impl SqlRows) -> Vec<String> {
    conn.texts("SELECT message_id AS value FROM prune_ledger")
}

/// Ends the server connections made from `db.tagged_url(tag)` (on
/// MariaDB/MySQL: every connection to `db` but `conn`); returns how many.
pub fn kill_tagged<B: ServerBackend>(db: &B, conn: &mut B::Connection, tag: &str) -> usize {
    let ids = conn.bigints(&db.tagged_connections_sql(tag));
    for id in &ids {
        // Gone already is fine.
        let _ = conn.batch_execute(&B::kill_sql(*id));
    }
    ids.len()
}

/// Inserts `(handler, id)` rows received `ago` seconds ago (by the database
/// clock), or now.
pub fn seed<B: TestBackend>(
    conn: &mut B::Connection,
    handler: &str,
    ids: &[String],
    ago: Option<i64>,
) {
    for chunk in ids.chunks(500) {
        // SQLite has no `DEFAULT` in a VALUES list: leave the column out.
        let (column, at) = match ago {
            Some(seconds) => (", received_at", format!(", {}", B::ago_sql(seconds))),
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
pub fn backdate<B: TestBackend>(conn: &mut B::Connection, handler: &str, ids: &[String], ago: i64) {
    let list: Vec<String> = ids.iter().map(|id| format!("'{id}'")).collect();
    let sql = format!(
        "UPDATE inbox_messages SET received_at = {} WHERE handler = '{handler}' AND message_id IN ({})",
        B::ago_sql(ago),
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
    C: LoadConnection<Backend: InboxBackend>,
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
