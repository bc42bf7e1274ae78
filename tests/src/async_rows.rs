//! [`AsyncSqlRows`]: reading back what a test's own SQL returns, on any
//! backend's diesel-async connection.

use std::future::Future;

use diesel::QueryableByName;
use diesel::query_builder::SqlQuery;
use diesel::sql_types::{BigInt, Text};
use diesel_async::methods::LoadQuery;
use diesel_async::{AsyncConnection, RunQueryDsl};

/// [`SqlRows`](crate::SqlRows) for diesel-async connections: reads the
/// `value` column of what a test's own SQL returns, text or `BIGINT`. Every
/// diesel-async connection whose backend reads both has it, so a test
/// generic over [`TestBackend`](crate::TestBackend) (whose async connections
/// are bound by it) can count and list rows without a query type per
/// backend. The futures are `Send`: a test may spawn them.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use inbox_tests::{AsyncSqlRows, Sqlite, TestBackend};
///
/// let db = Sqlite::open().unwrap();
/// inbox_tests::runtime::current_thread().block_on(async {
///     let mut conn = db.connect_async().await;
///     assert_eq!(conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages").await, 0);
///     assert_eq!(conn.texts("SELECT 'a' AS value UNION ALL SELECT 'b'").await, ["a", "b"]);
/// });
/// # }
/// ```
pub trait AsyncSqlRows: Send {
    /// The `value` column (text) of every row `sql` returns, in order.
    fn texts(&mut self, sql: &str) -> impl Future<Output = Vec<String>> + Send;

    /// The `value` column (`BIGINT`) of every row `sql` returns, in order.
    fn bigints(&mut self, sql: &str) -> impl Future<Output = Vec<i64>> + Send;

    /// The `value` column (`BIGINT`) of the one row `sql` returns.
    fn bigint(&mut self, sql: &str) -> impl Future<Output = i64> + Send {
        async move {
            match self.bigints(sql).await[..] {
                [value] => value,
                ref rows => panic!("{sql}: one row expected, got {}", rows.len()),
            }
        }
    }
}

#[derive(QueryableByName)]
struct TextValue {
    #[diesel(sql_type = Text)]
    value: String,
}

#[derive(QueryableByName)]
struct BigIntValue {
    #[diesel(sql_type = BigInt)]
    value: i64,
}

impl<C> AsyncSqlRows for C
where
    C: AsyncConnection + Send,
    SqlQuery: LoadQuery<'static, C, TextValue> + LoadQuery<'static, C, BigIntValue>,
{
    async fn texts(&mut self, sql: &str) -> Vec<String> {
        diesel::sql_query(sql)
            .load::<TextValue>(self)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"))
            .into_iter()
            .map(|row| row.value)
            .collect()
    }

    async fn bigints(&mut self, sql: &str) -> Vec<i64> {
        diesel::sql_query(sql)
            .load::<BigIntValue>(self)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"))
            .into_iter()
            .map(|row| row.value)
            .collect()
    }
}
