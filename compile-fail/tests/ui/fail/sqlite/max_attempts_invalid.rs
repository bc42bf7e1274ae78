use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id, max_attempts = 0)]
pub fn zero(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = msg.id, max_attempts = -1)]
pub fn negative(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = msg.id, max_attempts = "5")]
pub fn quoted(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = msg.id, max_attempts = 99999999999)]
pub fn too_large(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = msg.id, max_attempts = infinite)]
pub fn unknown_word(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = msg.id, max_attempts = 3, max_attempts = 4)]
pub fn twice(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
