//! A pooled connection taken by value behind a type alias the attribute
//! cannot see through: one error, at the parameter, suggesting `conn = ...`;
//! the body (`.execute(conn)`, as for a lent connection) adds none.

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, PooledConnection};
use inbox_runtime::idempotent;

type Conn = PooledConnection<ConnectionManager<SqliteConnection>>;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub fn apply_payment(conn: Conn, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

fn main() {}
