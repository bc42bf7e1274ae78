use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

// Three mistakes in one attribute: all three are reported in one build.
#[idempotent(id = uuid::Uuid::new_v4(), retries = 3, handler = "")]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
