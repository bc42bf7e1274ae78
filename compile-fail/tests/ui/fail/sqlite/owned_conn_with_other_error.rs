//! Any error, with a connection taken by value: the function is emitted with
//! the connection lent as the expansion would, so the body
//! (`.execute(conn)`) adds no type errors to the real one.

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, PooledConnection};
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = uuid::Uuid::new_v4())]
pub fn apply_payment(
    conn: PooledConnection<ConnectionManager<SqliteConnection>>,
    msg: &Payment,
) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

fn main() {}
