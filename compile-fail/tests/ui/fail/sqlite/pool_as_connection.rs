//! A pool where the connection should be: the handler's transaction runs on
//! one connection, which the caller takes from the pool.

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub fn apply_payment(
    pool: &Pool<ConnectionManager<SqliteConnection>>,
    msg: &Payment,
) -> QueryResult<()> {
    let mut conn = pool.get().expect("a connection");
    diesel::sql_query("SELECT 1").execute(&mut conn)?;
    Ok(())
}

fn main() {}
