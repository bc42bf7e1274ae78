//! An async handler that does not return a `Result` is refused with the same
//! sentence as a blocking one (reported at the return type, and once more at
//! the attribute, where the awaited runtime step repeats the bound).

use diesel_async::AsyncPgConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
async fn apply(conn: &mut AsyncPgConnection, msg: &Payment) -> Option<()> {
    let _ = conn;
    Some(())
}

fn main() {}
