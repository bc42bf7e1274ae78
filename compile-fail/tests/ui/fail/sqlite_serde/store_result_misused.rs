use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id, store_result = true)]
pub fn flag_with_value(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = msg.id, fingerprint)]
pub fn fingerprint_without_value(
    conn: &mut SqliteConnection,
    msg: &Payment,
) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
