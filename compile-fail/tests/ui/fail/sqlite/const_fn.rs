use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub const fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> Result<(), ()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
