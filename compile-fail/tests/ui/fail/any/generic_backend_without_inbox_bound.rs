use diesel::Connection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

// `C::Backend: InboxBackend` is missing: the inbox cannot know `C`'s backend.
#[idempotent(id = msg.id)]
pub fn apply_payment<C: Connection>(conn: &mut C, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {}
