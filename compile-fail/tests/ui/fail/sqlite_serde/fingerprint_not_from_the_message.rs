use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
    pub body: String,
}

pub struct Delivery {
    pub delivery_tag: u64,
    pub body: String,
}

// A constant fingerprint tells no payload from another.
#[idempotent(id = msg.id, fingerprint = "payload")]
pub fn literal(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

// The connection is not the message.
#[idempotent(id = msg.id, fingerprint = conn)]
pub fn connection(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

// A value computed per delivery makes every redelivery a conflict.
#[idempotent(id = msg.id, fingerprint = std::time::SystemTime::now())]
pub fn computed(conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

// So does a broker's per-delivery field.
#[idempotent(id = delivery.body, fingerprint = delivery.delivery_tag)]
pub fn per_delivery(conn: &mut SqliteConnection, delivery: &Delivery) -> diesel::QueryResult<()> {
    let _ = (conn, delivery);
    Ok(())
}

fn main() {}
