use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

// A duplicate skips the body: there would be no `u32` to return for it.
#[idempotent(id = msg.id)]
pub fn apply_payment(
    conn: &mut SqliteConnection,
    msg: &Payment,
) -> Result<u32, diesel::result::Error> {
    let _ = conn;
    Ok(1)
}

fn main() {}
