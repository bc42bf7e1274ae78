use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub fn apply_payment(msg: &Payment) -> diesel::QueryResult<()> {
    let _ = msg;
    Ok(())
}

fn main() {}
