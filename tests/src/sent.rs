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
/// table whose name contains `effects`), `COMMIT` (on PostgreSQL `SET LOCAL
/// inbox.committing = 'on'; COMMIT`), `ROLLBACK`, `read stored` (a duplicate's read of the
/// fingerprint and result stored with the claim it met), `read claim` (the
/// row of a claim that reads what it met, read apart after it ran: a
/// blocking MariaDB connection's first such claim), `count attempt`,
/// `mark dead`; anything else as it was sent. MySQL/MariaDB's framing of an outermost transaction reads as
/// the others': `autocommit` off (with the claim token, if any) and the
/// savepoint `inbox_transaction` as `BEGIN`, the savepoint's release and
/// the commit by `autocommit` (turned on, then restored; or the commit
/// that checks the claim token first) as `COMMIT`, `ROLLBACK` and
/// `autocommit` restored as `ROLLBACK` (the
/// statements themselves are counted in `e2e/roundtrips.rs`). A statement sent as a prepared statement (MySQL's transaction
/// statements) reads with its binds, none: `BEGIN -- binds: []`.
///
/// ```
/// let sent = [
///     "BEGIN -- binds: []".to_owned(),
///     "SET LOCAL inbox.committing = 'on'; COMMIT".to_owned(),
/// ];
/// assert_eq!(inbox_tests::statement_shapes(&sent), ["BEGIN", "COMMIT"]);
/// let mysql = [
///     "SET @inbox_saved_autocommit = @@SESSION.autocommit, SESSION autocommit = 0 -- binds: []",
///     "SAVEPOINT inbox_transaction -- binds: []",
///     "RELEASE SAVEPOINT inbox_transaction -- binds: []",
///     "SET SESSION autocommit = 1, SESSION autocommit = @inbox_saved_autocommit -- binds: []",
/// ]
/// .map(String::from);
/// assert_eq!(inbox_tests::statement_shapes(&mysql), ["BEGIN", "COMMIT"]);
/// let checked = [
///     "SET @inbox_saved_autocommit = @@SESSION.autocommit, SESSION autocommit = 0, \
///      @inbox_claim_token = UNHEX(REPLACE(UUID(), '-', '')) -- binds: []",
///     "SET SESSION autocommit = IF(EXISTS(SELECT 1 FROM inbox_messages WHERE …), 'ON', …) -- binds: [\"h\", \"m\"]",
/// ]
/// .map(String::from);
/// assert_eq!(inbox_tests::statement_shapes(&checked), ["BEGIN", "COMMIT"]);
/// ```
pub fn statement_shapes(statements: &[String]) -> Vec<&str> {
    statements
        .iter()
        .map(
            |sql| match sql.strip_suffix(" -- binds: []").unwrap_or(sql) {
                "BEGIN" => "BEGIN",
                "ROLLBACK" => "ROLLBACK",
                "COMMIT" | "SET LOCAL inbox.committing = 'on'; COMMIT" => "COMMIT",
                sql if sql.starts_with("SET SESSION autocommit = 1,") => "COMMIT",
                sql if sql.starts_with("SET SESSION autocommit = IF(") => "COMMIT",
                sql if sql.starts_with("SET @inbox_saved_autocommit") => "BEGIN",
                sql if is_claim(sql) => "claim",
                sql if sql.starts_with("SELECT fingerprint, result FROM inbox_messages") => {
                    "read stored"
                }
                sql if sql.starts_with("SELECT claim_token <=> ") => "read claim",
                sql if sql.starts_with("INSERT INTO inbox_failures") => "count attempt",
                sql if sql.starts_with("UPDATE inbox_failures") => "mark dead",
                sql if sql.starts_with("INSERT") && sql.contains("effects") => "effect",
                sql => sql,
            },
        )
        .filter(|shape| !MYSQL_FRAMING.contains(shape))
        .collect()
}

/// Whether `sql` is a claim: the plain `INSERT`, or the one bounded by the
/// delivery's claim wait (PostgreSQL's `WITH inbox_wait … INSERT`,
/// MariaDB's `SET STATEMENT innodb_lock_wait_timeout = N FOR INSERT …`).
fn is_claim(sql: &str) -> bool {
    let sql = match sql.strip_prefix("SET STATEMENT innodb_lock_wait_timeout = ") {
        Some(rest) => rest
            .split_once(" FOR ")
            .map_or(rest, |(_, statement)| statement),
        None => sql,
    };
    (sql.starts_with("INSERT")
        || sql.starts_with("WITH inbox_wait")
        || sql.starts_with("WITH inbox_claim"))
        && sql.contains("inbox_messages")
}

/// What MySQL/MariaDB send around an outermost transaction besides what
/// [`statement_shapes`] reads as `BEGIN`, `COMMIT` and `ROLLBACK`.
const MYSQL_FRAMING: [&str; 3] = [
    "SAVEPOINT inbox_transaction",
    "RELEASE SAVEPOINT inbox_transaction",
    "SET SESSION autocommit = IFNULL(@inbox_saved_autocommit, @@SESSION.autocommit)",
];

/// The server's counters of the statements one MariaDB/MySQL session sent:
/// `[set option, prepare, execute]` (`Com_set_option`, `Com_stmt_prepare`,
/// `Com_stmt_execute` of `SESSION_STATUS`). Reading them is itself a
/// statement: compare two readings in a row to subtract it.
///
/// ```no_run
/// # #[cfg(feature = "mysql")] {
/// let Some(db) = <inbox_tests::Mysql as inbox_tests::TestBackend>::open() else { return };
/// let mut conn = inbox_tests::TestBackend::connect(&db);
/// let [set_options, prepared, executed] = inbox_tests::mysql_commands(&mut conn);
/// # let _ = (set_options, prepared, executed);
/// # }
/// ```
pub fn mysql_commands<C: crate::SqlRows>(conn: &mut C) -> [i64; 3] {
    commands(conn.bigints(MYSQL_COMMANDS_SQL))
}

/// [`mysql_commands`] on a diesel-async connection.
///
/// ```no_run
/// # #[cfg(all(feature = "mysql", feature = "async"))] {
/// let Some(db) = <inbox_tests::Mysql as inbox_tests::TestBackend>::open() else { return };
/// inbox_tests::runtime::current_thread().block_on(async {
///     let mut conn = inbox_tests::TestBackend::connect_async(&db).await;
///     let [set_options, prepared, executed] = inbox_tests::mysql_commands_async(&mut conn).await;
///     # let _ = (set_options, prepared, executed);
/// });
/// # }
/// ```
#[cfg(feature = "async")]
pub async fn mysql_commands_async<C: crate::AsyncSqlRows>(conn: &mut C) -> [i64; 3] {
    commands(conn.bigints(MYSQL_COMMANDS_SQL).await)
}

/// The counters [`mysql_commands`] reads, in its order.
const MYSQL_COMMANDS_SQL: &str = "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS value \
     FROM information_schema.SESSION_STATUS \
     WHERE VARIABLE_NAME IN ('COM_SET_OPTION', 'COM_STMT_PREPARE', 'COM_STMT_EXECUTE') \
     ORDER BY FIELD(VARIABLE_NAME, 'COM_SET_OPTION', 'COM_STMT_PREPARE', 'COM_STMT_EXECUTE')";

/// The three counters of [`MYSQL_COMMANDS_SQL`]'s rows.
fn commands(rows: Vec<i64>) -> [i64; 3] {
    rows.try_into()
        .unwrap_or_else(|rows| panic!("three counters expected, got {rows:?}"))
}

/// What `deliver` cost `conn` in the server's counters ([`mysql_commands`]),
/// the counters' own reading taken off: `[set option, prepare, execute]`.
pub fn mysql_commands_of<C: crate::SqlRows>(
    conn: &mut C,
    deliver: impl FnOnce(&mut C),
) -> [i64; 3] {
    let first = mysql_commands(conn);
    let second = mysql_commands(conn);
    let before = mysql_commands(conn);
    deliver(conn);
    let after = mysql_commands(conn);
    cost([first, second, before, after])
}

/// [`mysql_commands_of`] on a diesel-async connection.
#[cfg(feature = "async")]
pub async fn mysql_commands_of_async<C: crate::AsyncSqlRows>(
    conn: &mut C,
    deliver: impl AsyncFnOnce(&mut C),
) -> [i64; 3] {
    let first = mysql_commands_async(conn).await;
    let second = mysql_commands_async(conn).await;
    let before = mysql_commands_async(conn).await;
    deliver(conn).await;
    let after = mysql_commands_async(conn).await;
    cost([first, second, before, after])
}

/// What happened between readings `before` and `after` of the counters,
/// less what a reading costs (from `first` to `second`).
fn cost([first, second, before, after]: [[i64; 3]; 4]) -> [i64; 3] {
    std::array::from_fn(|i| (after[i] - before[i]) - (second[i] - first[i]))
}
