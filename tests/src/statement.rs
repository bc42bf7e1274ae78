//! [`Statement`]: a test's own SQL text, run on any backend's connection,
//! blocking or async, from a test generic over the backend.

use diesel::QueryResult;
use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};

/// SQL text of a test's own, run with `execute` (Diesel's or diesel-async's
/// `RunQueryDsl`) as a prepared statement, like `diesel::sql_query`, but on
/// a connection whose backend is a type parameter: `sql_query` needs
/// bounds a generic test cannot name, this needs none.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::RunQueryDsl;
/// use inbox_tests::{statement, Sqlite, SqlRows, TestBackend};
///
/// fn insert_one<B: TestBackend>(conn: &mut B::Connection) {
///     statement("INSERT INTO inbox_messages (handler, message_id) VALUES ('h', 'm')")
///         .execute(conn)
///         .unwrap();
/// }
///
/// let db = Sqlite::open().unwrap();
/// let mut conn = db.connect();
/// insert_one::<Sqlite>(&mut conn);
/// assert_eq!(conn.bigint("SELECT COUNT(*) AS value FROM inbox_messages"), 1);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Statement(String);

/// [`Statement`] of `sql`.
pub fn statement(sql: impl Into<String>) -> Statement {
    Statement(sql.into())
}

impl<DB: Backend> QueryFragment<DB> for Statement {
    fn walk_ast<'b>(&'b self, mut pass: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        pass.push_sql(&self.0);
        Ok(())
    }
}

/// Every statement is its own query: none shares a prepared statement by
/// type (the cache keys them by their text).
impl QueryId for Statement {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

/// diesel-async's `RunQueryDsl` covers every type already.
impl<C> diesel::RunQueryDsl<C> for Statement {}
