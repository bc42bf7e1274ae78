use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub partition: u32,
    pub offset: u64,
}

// Inline captures (`{partition}`) are not checked: the attribute cannot see what they name.
#[idempotent(id = format!("{partition}:{offset}"))]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

// One argument not rooted in a parameter is enough to refuse the id.
#[idempotent(id = format!("{}:{}", msg.partition, std::process::id()))]
pub fn apply_refund(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
