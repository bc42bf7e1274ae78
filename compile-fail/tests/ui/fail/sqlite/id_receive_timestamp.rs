use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Received {
    pub id: String,
    pub received_at: i64,
}

// The time a delivery was received differs between deliveries of one message.
#[idempotent(id = msg.received_at, handler = "received")]
pub fn by_time(conn: &mut SqliteConnection, msg: &Received) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
