use diesel::SqliteConnection;
use inbox_runtime::idempotent;
use uuid::Uuid;

pub struct Payment {
    pub id: Uuid,
}

// A fresh UUID differs on every delivery: every redelivery would be processed again.
#[idempotent(id = Uuid::new_v4())]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
