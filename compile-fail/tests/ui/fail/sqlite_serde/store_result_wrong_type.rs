use diesel::SqliteConnection;
use inbox_runtime::{idempotent, Outcome, StoredOutcome};

pub struct Payment {
    pub id: String,
}

pub struct Receipt {
    pub number: u64,
}

// `store_result` replays through `StoredOutcome`, not `Outcome`.
#[idempotent(id = msg.id, store_result)]
pub fn outcome(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<Outcome<u64>> {
    let _ = (conn, msg);
    Ok(Outcome::Processed(1))
}

// A result that serde cannot store.
#[idempotent(id = msg.id, store_result)]
pub fn not_serializable(
    conn: &mut SqliteConnection,
    msg: &Payment,
) -> diesel::QueryResult<StoredOutcome<Receipt>> {
    let _ = (conn, msg);
    Ok(StoredOutcome::Processed(Receipt { number: 1 }))
}

// `StoredOutcome` without `store_result`: nothing would be stored to replay.
#[idempotent(id = msg.id)]
pub fn without_store_result(
    conn: &mut SqliteConnection,
    msg: &Payment,
) -> diesel::QueryResult<StoredOutcome<u64>> {
    let _ = (conn, msg);
    Ok(StoredOutcome::Processed(1))
}

fn main() {}
