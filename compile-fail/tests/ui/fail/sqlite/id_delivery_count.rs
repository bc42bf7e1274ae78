use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Received {
    pub id: String,
    pub delivery_count: u32,
}

impl Received {
    pub fn delivery_attempt(&self) -> u32 {
        self.delivery_count
    }
}

// A delivery count grows with every redelivery.
#[idempotent(id = msg.delivery_count, handler = "counts.field")]
pub fn by_count(conn: &mut SqliteConnection, msg: &Received) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = msg.delivery_attempt().to_string(), handler = "counts.method")]
pub fn by_attempt(conn: &mut SqliteConnection, msg: &Received) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
