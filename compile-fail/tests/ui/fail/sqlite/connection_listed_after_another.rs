//! Two connections, the handler's listed second: the attribute takes the
//! first, and the error about the second offers `conn = conn`.

use diesel::prelude::*;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub fn apply_payment(
    audit: &mut SqliteConnection,
    conn: &mut SqliteConnection,
    msg: &Payment,
) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    diesel::sql_query("SELECT 2").execute(audit)?;
    Ok(())
}

fn main() {}
