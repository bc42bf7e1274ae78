//! [`SqlRows`]: reading back what a test's own SQL returns, on any
//! backend's connection.

use diesel::prelude::*;
use diesel::query_builder::SqlQuery;
use diesel::query_dsl::LoadQuery;
use diesel::sql_types::{BigInt, Text};

/// Reads the `value` column of what a test's own SQL returns: text or
/// `BIGINT`. Every connection whose backend reads both has it, so a test
/// generic over [`TestBackend`](crate::TestBackend) (whose connections are
/// bound by it) can count and list rows without a query type per backend.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use inbox_tests::{Sqlite, SqlRows, TestBackend};
///
/// let db = Sqlite::open().unwrap();
/// let mut conn = db.connect();
/// assert_eq!(conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages"), 0);
/// assert_eq!(conn.texts("SELECT 'a' AS value UNION ALL SELECT 'b'"), ["a", "b"]);
/// # }
/// ```
pub trait SqlRows {
    /// The `value` column (text) of every row `sql` returns, in order.
    fn texts(&mut self, sql: &str) -> Vec<String>;

    /// The `value` column (`BIGINT`) of every row `sql` returns, in order.
    fn bigints(&mut self, sql: &str) -> Vec<i64>;

    /// The `value` column (`BIGINT`) of the one row `sql` returns.
    fn bigint(&mut self, sql: &str) -> i64 {
        match self.bigints(sql)[..] {
            [value] => value,
            ref rows => panic!("{sql}: one row expected, got {}", rows.len()),
        }
    }
}

/// A text `value` (public for the bound below; not exported).
#[derive(QueryableByName)]
pub struct TextValue {
    #[diesel(sql_type = Text)]
    value: String,
}

/// A `BIGINT` `value` (public for the bound below; not exported).
#[derive(QueryableByName)]
pub struct BigIntValue {
    #[diesel(sql_type = BigInt)]
    value: i64,
}

impl<C> SqlRows for C
where
    C: Connection,
    SqlQuery: LoadQuery<'static, C, TextValue> + LoadQuery<'static, C, BigIntValue>,
{
    fn texts(&mut self, sql: &str) -> Vec<String> {
        diesel::sql_query(sql)
            .load::<TextValue>(self)
            .unwrap_or_else(|error| panic!("{sql}: {error}"))
            .into_iter()
            .map(|row| row.value)
            .collect()
    }

    fn bigints(&mut self, sql: &str) -> Vec<i64> {
        diesel::sql_query(sql)
            .load::<BigIntValue>(self)
            .unwrap_or_else(|error| panic!("{sql}: {error}"))
            .into_iter()
            .map(|row| row.value)
            .collect()
    }
}
