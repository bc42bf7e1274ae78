//! Each server error that decides between retry, reconnect and never,
//! produced for real on each server, blocking and async: the tables they
//! print show what each driver said and what `recovery()` answered.

use std::time::{Duration, Instant};

use diesel::result::Error;
use inbox_tests::{ServerBackend, SqlRows};

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
