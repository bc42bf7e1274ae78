//! `outside_transaction` must name a parameter or a pool the body uses: a
//! stale or misspelled name is an error, not a silent opt-out.

use diesel::prelude::*;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id, outside_transaction = [audit, replica])]
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
