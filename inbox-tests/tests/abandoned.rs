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
#![cfg(feature = "async")]

use std::time::{Duration, Instant};

/// The bound the tests set; the redelivery must finish well within
/// `REDELIVERY_DEADLINE` (a hang, not a slow run, is the failure).
const BOUND: Duration = Duration::from_secs(2);
const REDELIVERY_DEADLINE: Duration = Duration::from_secs(60);

macro_rules! abandoned_tests {
    ($conn:ty, $database:ty, $connection_id_sql:expr) => {
        use diesel::prelude::*;
        use diesel_async::pooled_connection::{deadpool, AsyncDieselConnectionManager};
        use diesel_async::RunQueryDsl;
        use inbox_runtime::{idempotent, Outcome};
        use inbox_tests::TestBackend as _;

        use super::*;

        type Conn = $conn;

        diesel::table! {
            abandoned_effects (message_id) {
                message_id -> Text,
            }
        }

        /// Claims, writes its effect, then waits for ever when `stall` is set.
        #[idempotent(id = msg.0, handler = "abandoned.record")]
        async fn record(
            conn: &mut deadpool::Object<Conn>,
            msg: &(String, bool),
        ) -> Result<Outcome<()>, diesel::result::Error> {
            diesel::insert_into(abandoned_effects::table)
                .values(abandoned_effects::message_id.eq(&msg.0))
                .execute(conn)
                .await?;
            if msg.1 {
                std::future::pending::<()>().await;
            }
            Ok(Outcome::Processed(()))
        }

        async fn connection_id(conn: &mut deadpool::Object<Conn>) -> i64 {
            diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>($connection_id_sql))
                .get_result(conn)
                .await
                .expect("read the connection id")
        }

        #[tokio::test]
        async fn a_cancelled_delivery_blocks_its_redelivery_no_longer_than_the_bound() {
            inbox_runtime::set_abandoned_transaction_timeout(Some(BOUND));
            let Some(db) = <$database>::open() else { return };
            let pool = deadpool::Pool::builder(AsyncDieselConnectionManager::<Conn>::new(db.url()))
                .max_size(2)
                .build()
                .expect("a pool");
            {
                // Both connections open and idle in the pool.
                let mut first = pool.get().await.expect("a connection");
                let _second = pool.get().await.expect("a second connection");
                diesel_async::SimpleAsyncConnection::batch_execute(
                    &mut *first,
                    "CREATE TABLE abandoned_effects (message_id VARCHAR(255) NOT NULL)",
                )
                .await
                .expect("create the effects table");
            }

            let stalled = ("m-1".to_owned(), true);
            let mut object = pool.get().await.expect("a connection");
            let abandoned_id = connection_id(&mut object).await;
            let cancelled = tokio::time::timeout(Duration::from_millis(300), record(&mut object, &stalled)).await;
            assert!(cancelled.is_err(), "the delivery was cancelled mid-body");
            drop(object); // back to the pool, its transaction still open

            let started = Instant::now();
            let redelivery = ("m-1".to_owned(), false);
            let outcome = tokio::time::timeout(REDELIVERY_DEADLINE, async {
                let mut object = pool.get().await.expect("a connection");
                let id = connection_id(&mut object).await;
                let outcome = record(&mut object, &redelivery).await;
                (id, outcome)
            })
            .await;
            let (redelivery_id, outcome) =
                outcome.expect("the redelivery waited for the abandoned transaction for ever");
            let waited = started.elapsed();
            println!(
                "abandoned {}: redelivery on connection {redelivery_id} (abandoned: {abandoned_id}) finished after {waited:.2?} with a bound of {BOUND:?}",
                stringify!($conn)
            );
            assert_ne!(
                redelivery_id, abandoned_id,
                "the redelivery ran on the pool's other connection, behind the abandoned lock"
            );
            assert_eq!(outcome.expect("processed"), Outcome::Processed(()));

            let mut observer = pool.get().await.expect("a connection");
            let effects: i64 = abandoned_effects::table
                .count()
                .get_result(&mut observer)
                .await
                .expect("count effects");
            assert_eq!(effects, 1, "the abandoned delivery's effect rolled back");
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    abandoned_tests!(
        diesel_async::AsyncPgConnection,
        inbox_tests::Postgres,
        "pg_backend_pid()::bigint"
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    abandoned_tests!(
        diesel_async::AsyncMysqlConnection,
        inbox_tests::Mysql,
        "CAST(CONNECTION_ID() AS SIGNED)"
    );
}
