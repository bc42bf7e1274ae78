//! A diesel-async pool (deadpool) beside the connection of an async handler.

use diesel::prelude::*;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub async fn apply_payment(
    conn: &mut AsyncPgConnection,
    pool: Pool<AsyncPgConnection>,
    msg: &Payment,
) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn).await?;
    drop(pool);
    Ok(())
}

fn main() {}
