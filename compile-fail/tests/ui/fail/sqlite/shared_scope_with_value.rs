use inbox_runtime::idempotent;

#[idempotent(id = msg, handler = "orders.reserve", shared_scope = true)]
fn reserve(conn: &mut diesel::SqliteConnection, msg: &str) -> diesel::QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {}
