use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Envelope {
    pub topic: String,
    pub offset: u64,
}

pub struct Payment {
    pub envelope: Envelope,
}

#[idempotent(id = msg.envelope)]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {}
