use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Reading {
    pub value: f64,
}

#[idempotent(id = msg.value)]
pub fn record(conn: &mut SqliteConnection, msg: &Reading) -> diesel::QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {}
