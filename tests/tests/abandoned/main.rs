//! A cancelled async delivery must not block its own redelivery for longer
//! than the bound set with `set_abandoned_transaction_timeout`, on
//! PostgreSQL and MariaDB, with the commonest setup: a deadpool pool of two
//! connections and one consumer.
//!
//! The consumer's first delivery is dropped mid-body (a timeout), which
//! leaves its transaction, and the row lock on the claimed id, open on a
//! connection that goes back to the pool as it is. The redelivery takes the
//! pool's other connection and waits for that lock: without a bound it waits
//! for ever (PostgreSQL's and MariaDB's defaults never end an idle
//! transaction). Its own binary, because the bound is process-wide.
#![cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use inbox_runtime::background::AsyncPool;
use inbox_runtime::{InboxBackend, Outcome, idempotent};
use inbox_tests::{AsyncSqlRows, ServerBackend, connection_id_async, statement};

/// The bound the tests set; the redelivery must finish well within
/// `REDELIVERY_DEADLINE` (a hang, not a slow run, is the failure).
const BOUND: Duration = Duration::from_secs(2);
const REDELIVERY_DEADLINE: Duration = Duration::from_secs(60);

/// Claims, writes its effect, then waits for ever when `stall` is set (on a
/// deadpool `Object`).
#[idempotent(id = msg.0, handler = "abandoned.record")]
async fn record<P>(conn: &mut P, msg: &(String, bool)) -> Result<Outcome<()>, diesel::result::Error>
where
    P: AsyncConnection<Backend: InboxBackend>,
{
    statement(format!(
        "INSERT INTO abandoned_effects (message_id) VALUES ('{}')",
        msg.0
    ))
    .execute(conn)
    .await?;
    if msg.1 {
        std::future::pending::<()>().await;
    }
    Ok(Outcome::Processed(()))
}

pub async fn a_cancelled_delivery_blocks_its_redelivery_no_longer_than_the_bound<
    B: ServerBackend,
>() {
    inbox_runtime::set_abandoned_transaction_timeout(Some(BOUND));
    let Some(db) = B::open() else { return };
    let pool = B::deadpool(db.url(), 2);
    {
        // Both connections open and idle in the pool.
        let mut first = pool.checkout().await.expect("a connection");
        let _second = pool.checkout().await.expect("a second connection");
        first
            .batch_execute("CREATE TABLE abandoned_effects (message_id VARCHAR(255) NOT NULL)")
            .await
            .expect("create the effects table");
    }

    let stalled = ("m-1".to_owned(), true);
    let mut object = pool.checkout().await.expect("a connection");
    let abandoned_id = connection_id_async::<B>(&mut *object).await;
    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), record(&mut object, &stalled)).await;
    assert!(cancelled.is_err(), "the delivery was cancelled mid-body");
    drop(object); // back to the pool, its transaction still open

    let started = Instant::now();
    let redelivery = ("m-1".to_owned(), false);
    let outcome = tokio::time::timeout(REDELIVERY_DEADLINE, async {
        let mut object = pool.checkout().await.expect("a connection");
        let id = connection_id_async::<B>(&mut *object).await;
        let outcome = record(&mut object, &redelivery).await;
        (id, outcome)
    })
    .await;
    let (redelivery_id, outcome) =
        outcome.expect("the redelivery waited for the abandoned transaction for ever");
    let waited = started.elapsed();
    println!(
        "abandoned {}: redelivery on connection {redelivery_id} (abandoned: {abandoned_id}) finished after {waited:.2?} with a bound of {BOUND:?}",
        B::NAME
    );
    assert_ne!(
        redelivery_id, abandoned_id,
        "the redelivery ran on the pool's other connection, behind the abandoned lock"
    );
    assert_eq!(outcome.expect("processed"), Outcome::Processed(()));

    let mut observer = pool.checkout().await.expect("a connection");
    let effects = observer
        .bigint("SELECT COUNT(*) AS value FROM abandoned_effects")
        .await;
    assert_eq!(effects, 1, "the abandoned delivery's effect rolled back");
}

inbox_tests::backend_tests!(async only [postgres, mysql]:
    a_cancelled_delivery_blocks_its_redelivery_no_longer_than_the_bound,
);
