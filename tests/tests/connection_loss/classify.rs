//! Each server error that decides between retry, reconnect and never,
//! produced for real on each server, blocking and async: the tables they
//! print show what each driver said and what `recovery()` answered.

use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::result::Error;
use inbox_runtime::{InboxBackend, idempotent};
use inbox_tests::{DieselBackend, ServerBackend, SqlRows};

use crate::support::{AppError, Findings};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;

/// How long a test waits for a connection to reach a statement or a lock.
const WAIT_DEADLINE: Duration = Duration::from_secs(20);

/// A delivery.
pub struct Msg {
    pub id: String,
}

fn msg(id: &str) -> Msg {
    Msg { id: id.to_owned() }
}

/// The handler each case delivers to: it updates a row of the lock table.
#[idempotent(id = msg.id, handler = "loss.classify")]
fn touch<C>(conn: &mut C, msg: &Msg) -> Result<(), AppError>
where
    C: diesel::connection::LoadConnection,
    C::Backend: InboxBackend,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    let _ = &msg.id;
    diesel::sql_query("UPDATE cls SET v = v + 1 WHERE k = 2").execute(conn)?;
    Ok(())
}

/// [`touch`] on a diesel-async connection.
#[cfg(feature = "async")]
#[idempotent(id = msg.id, handler = "loss.classify_async")]
async fn touch_async<C>(conn: &mut C, msg: &Msg) -> Result<(), AppError>
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<C::Backend>,
{
    let _ = &msg.id;
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query("UPDATE cls SET v = v + 1 WHERE k = 2"),
        conn,
    )
    .await?;
    Ok(())
}

/// Blocks until `count_sql` (a scalar subquery) counts more than zero on
/// `observer`; fails the test with `never` after 20 s.
fn wait_until<B: ServerBackend>(observer: &mut B::Connection, count_sql: &str, never: &str) {
    let deadline = Instant::now() + WAIT_DEADLINE;
    while observer.bigint(&format!("SELECT {count_sql} AS value")) == 0 {
        assert!(Instant::now() < deadline, "{never}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// [`wait_until`] on a diesel-async connection.
#[cfg(feature = "async")]
async fn wait_until_async<B: ServerBackend>(
    observer: &mut B::AsyncConnection,
    count_sql: &str,
    never: &str,
) {
    use inbox_tests::AsyncSqlRows;
    let deadline = Instant::now() + WAIT_DEADLINE;
    while observer
        .bigint(&format!("SELECT {count_sql} AS value"))
        .await
        == 0
    {
        assert!(Instant::now() < deadline, "{never}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The error of a deadlock's victim: whichever of the two statements failed.
fn victim(a: Result<(), Error>, b: Result<(), Error>) -> Error {
    [a, b]
        .into_iter()
        .find_map(Result::err)
        .expect("one of the two is the deadlock's victim")
}

/// A delivery on a new connection whose session `read_only_sql` made
/// read-only: refused, and the error says `Reconnect` (recorded as `case`).
fn read_only_refused<B: ServerBackend>(
    db: &B,
    read_only_sql: &str,
    case: &'static str,
    seen: &mut Findings,
) where
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<DieselBackend<B>>,
{
    use diesel::connection::SimpleConnection;
    let mut read_only = db.connect();
    read_only.batch_execute(read_only_sql).unwrap();
    let error = touch(&mut read_only, &msg("ro-1")).expect_err("read-only");
    seen.handler(case, &error, inbox_runtime::Recovery::Reconnect);
}

/// [`read_only_refused`] on a diesel-async connection.
#[cfg(feature = "async")]
async fn read_only_refused_async<B: ServerBackend>(
    db: &B,
    read_only_sql: &str,
    case: &'static str,
    seen: &mut Findings,
) where
    diesel::query_builder::SqlQuery: diesel::query_builder::QueryFragment<DieselBackend<B>>,
{
    use diesel_async::SimpleAsyncConnection;
    let mut read_only = db.connect_async().await;
    read_only.batch_execute(read_only_sql).await.unwrap();
    let error = touch_async(&mut read_only, &msg("ro-1"))
        .await
        .expect_err("read-only");
    seen.handler(case, &error, inbox_runtime::Recovery::Reconnect);
}

/// The server's test database with the lock table (`locks_ddl`, run on the
/// first connection), and two connections to it; `None` when it skips.
fn with_locks<B: ServerBackend>(locks_ddl: &str) -> Option<(B, B::Connection, B::Connection)> {
    use diesel::connection::SimpleConnection;
    let db = B::open()?;
    let mut a = db.connect();
    a.batch_execute(locks_ddl).expect("create the lock table");
    let b = db.connect();
    Some((db, a, b))
}

/// [`with_locks`] on diesel-async connections.
#[cfg(feature = "async")]
async fn with_locks_async<B: ServerBackend>(
    locks_ddl: &str,
) -> Option<(B, B::AsyncConnection, B::AsyncConnection)> {
    use diesel_async::SimpleAsyncConnection;
    let db = B::open()?;
    let mut a = db.connect_async().await;
    a.batch_execute(locks_ddl)
        .await
        .expect("create the lock table");
    let b = db.connect_async().await;
    Some((db, a, b))
}
