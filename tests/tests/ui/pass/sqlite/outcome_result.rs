// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent};

pub struct Order {
    pub id: String,
    pub items: Vec<u32>,
}

#[idempotent(id = msg.id)]
fn count_items(conn: &mut SqliteConnection, msg: &Order) -> QueryResult<Outcome<usize>> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(msg.items.len().into())
}

#[idempotent(id = msg.id, handler = "orders.explicit")]
fn explicit(conn: &mut SqliteConnection, msg: &Order) -> QueryResult<Outcome<u32>> {
    let _ = conn;
    Ok(Outcome::Processed(msg.items.iter().sum()))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Order {
        id: "order-1".into(),
        items: vec![1, 2, 3],
    };
    assert_eq!(count_items(&mut conn, &msg).unwrap(), Outcome::Processed(3));
    assert_eq!(count_items(&mut conn, &msg).unwrap(), Outcome::Duplicate);
    // Another handler has a scope of its own: it processes the same message once.
    assert_eq!(explicit(&mut conn, &msg).unwrap(), Outcome::Processed(6));
    assert!(explicit(&mut conn, &msg).unwrap().is_duplicate());
}
