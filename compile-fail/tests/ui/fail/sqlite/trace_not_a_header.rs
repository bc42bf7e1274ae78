use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
    pub attempt: u32,
}

#[idempotent(id = msg.id, trace = msg.attempt)]
pub fn apply(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {}
