//! A server connection's id, and ending one: what the tests that kill a
//! consumer's connection share, blocking and async.

use std::time::{Duration, Instant};

use diesel::RunQueryDsl;

use crate::{ServerBackend, SqlRows, statement};

/// How long a killed connection may stay listed before the test fails.
const KILL_DEADLINE: Duration = Duration::from_secs(10);

/// The server's id of `conn` (PostgreSQL's backend pid, MariaDB/MySQL's
/// connection id).
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use inbox_tests::{connection_id, terminate, Postgres, TestBackend};
///
/// let Some(db) = Postgres::open() else { return }; // `skipped:` printed
/// let mut victim = db.connect();
/// let id = connection_id::<Postgres>(&mut victim);
/// terminate::<Postgres>(&mut db.connect(), id);
/// # }
/// ```
pub fn connection_id<B: ServerBackend>(conn: &mut B::Connection) -> i64 {
    conn.bigint(&format!("SELECT {} AS value", B::CONNECTION_ID_SQL))
}

/// Ends server connection `victim` from `killer` and waits (at most 10 s,
/// then fails the test) until the server no longer lists it.
pub fn terminate<B: ServerBackend>(killer: &mut B::Connection, victim: i64) {
    statement(B::kill_sql(victim))
        .execute(killer)
        .expect("kill the connection");
    let deadline = Instant::now() + KILL_DEADLINE;
    while killer.bigint(&format!("SELECT {} AS value", B::alive_sql(victim))) > 0 {
        assert!(
            Instant::now() < deadline,
            "connection {victim} outlived its kill"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// [`connection_id`] on a diesel-async connection.
#[cfg(feature = "async")]
pub async fn connection_id_async<B: ServerBackend>(conn: &mut B::AsyncConnection) -> i64 {
    use crate::AsyncSqlRows;
    conn.bigint(&format!("SELECT {} AS value", B::CONNECTION_ID_SQL))
        .await
}

/// [`terminate`] from a diesel-async connection.
#[cfg(feature = "async")]
pub async fn terminate_async<B: ServerBackend>(killer: &mut B::AsyncConnection, victim: i64) {
    use crate::AsyncSqlRows;
    diesel_async::RunQueryDsl::execute(statement(B::kill_sql(victim)), killer)
        .await
        .expect("kill the connection");
    let deadline = Instant::now() + KILL_DEADLINE;
    loop {
        let alive = killer
            .bigint(&format!("SELECT {} AS value", B::alive_sql(victim)))
            .await;
        if alive == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "connection {victim} outlived its kill"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
