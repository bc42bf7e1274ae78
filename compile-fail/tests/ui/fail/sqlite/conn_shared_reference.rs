//! A connection taken by shared reference cannot run the transaction: one
//! error, at the parameter, saying how to fix it; the body, written for the
//! `&mut` connection, adds no errors of its own.

use diesel::prelude::*;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub fn apply_payment(conn: &SqliteConnection, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

fn main() {}
