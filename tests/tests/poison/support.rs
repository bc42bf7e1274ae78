//! What the poison tests share: a fresh database with the effects and locks
//! tables, reads of effects, claims and `inbox_failures` from an observer
//! connection, keys, bounded waits (and the bound that calls a wait a hang),
//! and quiet deliberate panics.

#![allow(dead_code)]

use std::time::Duration;

use diesel::connection::SimpleConnection;
use inbox_runtime::{ClaimKey, HandlerName};
use inbox_tests::{SqlRows, TestBackend};

/// What handler bodies write: one row per effect, no unique key, so an
/// effect committed twice shows up twice. Valid on every backend.
pub const EFFECTS_DDL: &str = "CREATE TABLE poison_effects \
     (message_id VARCHAR(255) NOT NULL, note VARCHAR(255) NOT NULL)";

/// One row the lock tests hold and fight over.
pub const LOCKS_DDL: &str =
    "CREATE TABLE poison_locks (id INTEGER NOT NULL PRIMARY KEY, n INTEGER NOT NULL)";

/// How long a delivery, a thread or a task may take before the test calls
/// it a hang: generous, the machine is shared; a hang never ends.
pub const HANG: Duration = Duration::from_secs(60);

/// A fresh database (inbox, effects and locks tables) and a connection to
/// it, or `None` after the harness's `skipped:` line.
pub fn fresh<B: TestBackend>() -> Option<(B, B::Connection)> {
    quiet_deliberate_panics();
    let (db, mut conn) = B::open_with_effects(EFFECTS_DDL)?;
    conn.batch_execute(LOCKS_DDL).expect("create poison_locks");
    conn.batch_execute("INSERT INTO poison_locks (id, n) VALUES (1, 0)")
        .expect("seed poison_locks");
    Some((db, conn))
}

/// `text` as an SQL string literal (the ids of these tests are plain words).
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The effects committed for message `id`.
pub fn effects(conn: &mut impl SqlRows, id: &str) -> i64 {
    conn.bigint(&format!(
        "SELECT COUNT(*) AS value FROM poison_effects WHERE message_id = {}",
        literal(id)
    ))
}

/// Every effect committed.
pub fn all_effects(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM poison_effects")
}

/// The claims of `(handler, id)`: 0 or 1.
pub fn claims(conn: &mut impl SqlRows, handler: &str, id: &str) -> i64 {
    conn.bigint(&format!(
        "SELECT COUNT(*) AS value FROM inbox_messages WHERE handler = {} AND message_id = {}",
        literal(handler),
        literal(id)
    ))
}

/// Every claim in the inbox.
pub fn all_claims(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages")
}

pub use inbox_tests::failure_rows::*;

/// A handler name.
pub fn handler(name: &str) -> HandlerName {
    HandlerName::new(name.to_owned()).expect("a valid handler name")
}

/// A claim key.
pub fn key(handler_name: &str, id: &str) -> ClaimKey {
    ClaimKey::new(handler(handler_name), id).expect("a valid id")
}

pub use inbox_tests::{panic_text, quiet_deliberate_panics};

/// SQL that makes the connection's lock waits end soon with a lock
/// conflict: PostgreSQL's `lock_timeout`, InnoDB's lock wait timeout (one
/// second, its least).
pub fn short_lock_wait_sql<B: TestBackend>() -> &'static str {
    if B::NAME == "mysql" {
        "SET SESSION innodb_lock_wait_timeout = 1"
    } else {
        "SET lock_timeout = '100ms'"
    }
}

/// Whether server connection `id` waits for a lock in a statement that
/// starts with `prefix`: a `BIGINT` query, 0 or 1.
pub fn waits_in_sql<B: TestBackend>(id: i64, prefix: &str) -> String {
    if B::NAME == "mysql" {
        format!(
            "SELECT COUNT(*) AS value FROM information_schema.PROCESSLIST \
             WHERE id = {id} AND info LIKE '{prefix}%'"
        )
    } else {
        format!(
            "SELECT COUNT(*) AS value FROM pg_stat_activity \
             WHERE pid = {id} AND wait_event_type = 'Lock' AND query LIKE '{prefix}%'"
        )
    }
}

/// Waits (at most [`HANG`]) until `ask` (a `BIGINT` query) says 1.
pub fn wait_until(observer: &mut impl SqlRows, ask: &str) {
    let deadline = std::time::Instant::now() + HANG;
    while observer.bigint(ask) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "never true after {HANG:?}: {ask}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
