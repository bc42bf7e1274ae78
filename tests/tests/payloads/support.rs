//! What the payload tests share: a fresh database with the effects table,
//! reads of effects and claims from an observer connection.

#![allow(dead_code)]

use diesel::connection::SimpleConnection;
use inbox_tests::{SqlRows, TestBackend};

/// What handler bodies write: one row per effect, with the payload it
/// applied, no unique key, so an effect committed twice shows up twice.
pub const EFFECTS_DDL: &str = "CREATE TABLE payload_effects \
     (message_id VARCHAR(255) NOT NULL, body VARCHAR(255) NOT NULL)";

/// A fresh database (inbox and effects table) and a connection to it, or
/// `None` after the harness's `skipped:` line.
pub fn fresh<B: TestBackend>() -> Option<(B, B::Connection)> {
    B::open_with_effects(EFFECTS_DDL)
}

/// `text` as an SQL string literal (the ids of these tests are plain words).
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The payloads applied for message `id`, in no particular order.
pub fn applied(conn: &mut impl SqlRows, id: &str) -> Vec<String> {
    let mut bodies = conn.texts(&format!(
        "SELECT body AS value FROM payload_effects WHERE message_id = {}",
        literal(id)
    ));
    bodies.sort();
    bodies
}

/// Every effect committed.
pub fn all_effects(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM payload_effects")
}

/// The claims of `(handler, id)`: 0 or 1.
pub fn claims(conn: &mut impl SqlRows, handler: &str, id: &str) -> i64 {
    conn.bigint(&format!(
        "SELECT COUNT(*) AS value FROM inbox_messages WHERE handler = {} AND message_id = {}",
        literal(handler),
        literal(id)
    ))
}

/// Whether the claim of `(handler, id)` stores a fingerprint and a result:
/// `(fingerprint, result)` as 0 or 1 each.
pub fn stored_columns(conn: &mut impl SqlRows, handler: &str, id: &str) -> (i64, i64) {
    let row = |column: &str, conn: &mut dyn FnMut(&str) -> i64| {
        conn(&format!(
            "SELECT COUNT(*) AS value FROM inbox_messages WHERE handler = {} \
             AND message_id = {} AND {column} IS NOT NULL",
            literal(handler),
            literal(id)
        ))
    };
    let mut ask = |sql: &str| conn.bigint(sql);
    (row("fingerprint", &mut ask), row("result", &mut ask))
}

/// Runs `sql` on `conn`, failing the test on an error.
pub fn run_sql(conn: &mut impl SimpleConnection, sql: &str) {
    conn.batch_execute(sql)
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}
