#![deny(dead_code)]

use diesel::SqliteConnection;
use inbox_runtime::idempotent;

struct Payment {
    id: String,
}

// The rewritten function is still the user's function: an unused handler is
// reported as dead code, at its name.
#[idempotent(id = msg.id, handler = "billing.apply_payment")]
fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {
    let _ = Payment { id: String::new() }.id;
}
