//! An async handler on a blocking connection: the connection is reported
//! as not a diesel-async one, at the parameter.
use diesel::prelude::*;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub async fn apply_payment(conn: &mut PgConnection, msg: &Payment) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {}
