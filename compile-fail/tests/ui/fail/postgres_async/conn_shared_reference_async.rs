//! The same for an async handler on diesel-async.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub async fn apply_payment(conn: &AsyncPgConnection, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn).await?;
    Ok(())
}

fn main() {}
