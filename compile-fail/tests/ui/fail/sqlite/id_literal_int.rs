use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: u64,
}

#[idempotent(id = 42)]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
