//! A second connection among the parameters: what the body writes through it
//! escapes the handler's transaction.

use diesel::prelude::*;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub fn apply_payment(
    conn: &mut SqliteConnection,
    audit: &mut SqliteConnection,
    msg: &Payment,
) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    diesel::sql_query("SELECT 2").execute(audit)?;
    Ok(())
}

fn main() {}
