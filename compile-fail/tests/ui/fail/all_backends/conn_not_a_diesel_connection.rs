use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
pub fn apply_payment(conn: &mut Vec<String>, msg: &Payment) -> diesel::QueryResult<()> {
    conn.push(msg.id.clone());
    Ok(())
}

fn main() {}
