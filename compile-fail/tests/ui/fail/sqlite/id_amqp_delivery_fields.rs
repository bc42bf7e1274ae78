use diesel::SqliteConnection;
use inbox_runtime::idempotent;

/// The fields of an AMQP delivery (lapin's `Delivery`) the broker sets per delivery.
pub struct Delivery {
    pub delivery_tag: u64,
    pub redelivered: bool,
    pub order_id: String,
}

// The delivery tag numbers deliveries on a channel: a redelivery gets a new one.
#[idempotent(id = delivery.delivery_tag, handler = "amqp.tag")]
pub fn by_tag(conn: &mut SqliteConnection, delivery: &Delivery) -> diesel::QueryResult<()> {
    let _ = (conn, delivery);
    Ok(())
}

// One part that changes per delivery changes the whole id.
#[idempotent(id = format!("{}-{}", delivery.order_id, delivery.redelivered), handler = "amqp.flag")]
pub fn by_flag(conn: &mut SqliteConnection, delivery: &Delivery) -> diesel::QueryResult<()> {
    let _ = (conn, delivery);
    Ok(())
}

fn main() {}
