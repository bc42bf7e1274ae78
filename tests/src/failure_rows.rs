//! The `inbox_failures` rows of failed attempts and dead messages, as the
//! poison-message and batch suites compare them.

use crate::{SqlRows, TestBackend};

/// `text` as an SQL string literal (test ids and handler names are plain
/// words).
fn sql_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Every row of `inbox_failures`.
pub fn all_failure_rows(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM inbox_failures")
}

/// The `inbox_failures` row of one message, as the tests compare it.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureRow {
    pub attempts: i64,
    pub last_error: String,
    pub dead: bool,
    pub rejected: bool,
}

/// The `inbox_failures` row of `(handler, id)`, if any.
pub fn failure_row<B: TestBackend>(
    conn: &mut B::Connection,
    handler: &str,
    id: &str,
) -> Option<FailureRow> {
    let integer = if B::NAME == "mysql" {
        "SIGNED"
    } else {
        "BIGINT"
    };
    let row = format!(
        "FROM inbox_failures WHERE handler = {} AND message_id = {}",
        sql_literal(handler),
        sql_literal(id)
    );
    let attempts = conn.bigints(&format!(
        "SELECT CAST(attempts AS {integer}) AS value {row}"
    ));
    let attempts = match attempts[..] {
        [] => return None,
        [attempts] => attempts,
        _ => panic!("two failure rows for one message"),
    };
    let last_error = conn
        .texts(&format!("SELECT last_error AS value {row}"))
        .remove(0);
    let dead = conn.bigint(&format!(
        "SELECT COUNT(*) AS value {row} AND dead_at IS NOT NULL"
    )) == 1;
    let rejected = conn.bigint(&format!("SELECT COUNT(*) AS value {row} AND rejected")) == 1;
    Some(FailureRow {
        attempts,
        last_error,
        dead,
        rejected,
    })
}

/// A counted, not (yet) dead message's row.
pub fn counted(attempts: i64, last_error: &str) -> Option<FailureRow> {
    Some(FailureRow {
        attempts,
        last_error: last_error.to_owned(),
        dead: false,
        rejected: false,
    })
}

/// A message dead after `attempts` failed attempts.
pub fn exhausted(attempts: i64, last_error: &str) -> Option<FailureRow> {
    Some(FailureRow {
        attempts,
        last_error: last_error.to_owned(),
        dead: true,
        rejected: false,
    })
}

/// A rejected message's row.
pub fn rejected(attempts: i64, reason: &str) -> Option<FailureRow> {
    Some(FailureRow {
        attempts,
        last_error: reason.to_owned(),
        dead: true,
        rejected: true,
    })
}
