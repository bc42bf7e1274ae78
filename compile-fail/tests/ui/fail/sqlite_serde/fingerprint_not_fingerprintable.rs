use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Opaque;

pub struct Payment {
    pub id: String,
    pub payload: Opaque,
}

#[idempotent(id = msg.id, fingerprint = msg.payload)]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {}
