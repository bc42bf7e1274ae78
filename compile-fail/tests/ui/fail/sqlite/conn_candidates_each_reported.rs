//! Two parameters that look meant as the connection, neither usable: each
//! gets an error of its own saying what is wrong with it.

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, PooledConnection};
use inbox_runtime::idempotent;

type Pooled = PooledConnection<ConnectionManager<SqliteConnection>>;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub fn apply_payment(conn: &SqliteConnection, pooled: Pooled, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    diesel::sql_query("SELECT 1").execute(pooled)?;
    Ok(())
}

fn main() {}
