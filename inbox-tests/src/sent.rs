//! The statements a connection sends, as Diesel hands them to the server:
//! its instrumentation sees every one, `batch_execute` included.

use std::sync::{Arc, Mutex};

use diesel::Connection;
use diesel::connection::InstrumentationEvent;

/// Runs `deliver` on `conn` and returns what it returned and the statements
/// it sent.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::connection::SimpleConnection;
/// use diesel::{Connection, SqliteConnection};
/// let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// let ((), sent) = inbox_tests::statements_of(&mut conn, |conn| {
///     conn.batch_execute("SELECT 1").unwrap();
/// });
/// assert_eq!(sent, ["SELECT 1"]);
/// # }
/// ```
pub fn statements_of<C: Connection, T>(
    conn: &mut C,
    deliver: impl FnOnce(&mut C) -> T,
) -> (T, Vec<String>) {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let recorder = Arc::clone(&sent);
    conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = event {
            recorder.lock().unwrap().push(query.to_string());
        }
    });
    let value = deliver(conn);
    conn.set_instrumentation(|_: InstrumentationEvent<'_>| {});
    let sent = sent.lock().unwrap().clone();
    (value, sent)
}

/// What each statement is: `BEGIN`, `claim`, `effect` (an `INSERT` into a
/// table whose name contains `effects`), `COMMIT` (on PostgreSQL `SELECT 1;
/// COMMIT`), `ROLLBACK`, `count attempt`, `mark dead`; anything else as it
/// was sent. A statement sent as a prepared statement (MySQL's transaction
/// statements) reads with its binds, none: `BEGIN -- binds: []`.
///
/// ```
/// let sent = ["BEGIN -- binds: []".to_owned(), "SELECT 1; COMMIT".to_owned()];
/// assert_eq!(inbox_tests::statement_shapes(&sent), ["BEGIN", "COMMIT"]);
/// ```
pub fn statement_shapes(statements: &[String]) -> Vec<&str> {
    statements
        .iter()
        .map(
            |sql| match sql.strip_suffix(" -- binds: []").unwrap_or(sql) {
                "BEGIN" => "BEGIN",
                "ROLLBACK" => "ROLLBACK",
                "COMMIT" | "SELECT 1; COMMIT" => "COMMIT",
                sql if sql.starts_with("INSERT") && sql.contains("inbox_messages") => "claim",
                sql if sql.starts_with("INSERT INTO inbox_failures") => "count attempt",
                sql if sql.starts_with("UPDATE inbox_failures") => "mark dead",
                sql if sql.starts_with("INSERT") && sql.contains("effects") => "effect",
                sql => sql,
            },
        )
        .collect()
}
