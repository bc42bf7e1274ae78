use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

pub fn now() -> u64 {
    0
}

#[idempotent(id = now())]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = std::time::SystemTime::now().elapsed().unwrap().as_nanos())]
pub fn apply_refund(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {
    let _ = now();
}
