//! A pool among the parameters: reported once, at the parameter (not again
//! at the `pool.get()` in the body).

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub fn apply_payment(
    conn: &mut SqliteConnection,
    pool: &Pool<ConnectionManager<SqliteConnection>>,
    msg: &Payment,
) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    let mut other = pool.get().expect("a connection");
    diesel::sql_query("SELECT 2").execute(&mut other)?;
    Ok(())
}

fn main() {}
