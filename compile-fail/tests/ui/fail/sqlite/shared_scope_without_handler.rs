use inbox_runtime::idempotent;

#[idempotent(id = msg, shared_scope)]
fn reserve(conn: &mut diesel::SqliteConnection, msg: &str) -> diesel::QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {}
