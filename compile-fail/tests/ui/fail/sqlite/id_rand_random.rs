use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

// No `rand` crate is needed: the attribute refuses the id before name resolution.
#[idempotent(id = rand::random::<u64>())]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
