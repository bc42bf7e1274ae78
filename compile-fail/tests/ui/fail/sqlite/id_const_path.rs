use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

pub mod config {
    pub const PAYMENT_ID: &str = "payment-1";
}

#[idempotent(id = config::PAYMENT_ID)]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {
    let _ = config::PAYMENT_ID;
}
