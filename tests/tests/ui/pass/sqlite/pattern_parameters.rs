// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent};

pub struct Payment {
    pub id: String,
    pub cents: i64,
}

// Destructuring patterns in the other parameters; the id comes from a binding.
#[idempotent(id = id)]
fn apply(
    conn: &mut SqliteConnection,
    Payment { id, cents }: &Payment,
) -> QueryResult<Outcome<i64>> {
    let _ = (conn, id);
    Ok(Outcome::Processed(*cents))
}

#[idempotent(id = format!("{}:{}", partition, offset))]
fn offsets(conn: &mut SqliteConnection, (partition, offset): (u32, u64), _: ()) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

// A `mut` binding of the message.
#[idempotent(id = msg.id, handler = "patterns.mutable")]
fn mutable(conn: &mut SqliteConnection, mut msg: Payment) -> QueryResult<Outcome<Payment>> {
    msg.cents += 1;
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(Outcome::Processed(msg))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Payment {
        id: "p-1".into(),
        cents: 3,
    };
    assert_eq!(apply(&mut conn, &msg).unwrap(), Outcome::Processed(3));
    assert_eq!(apply(&mut conn, &msg).unwrap(), Outcome::Duplicate);
    offsets(&mut conn, (1, 2), ()).unwrap();
    let out = mutable(&mut conn, msg).unwrap().processed().unwrap();
    assert_eq!(out.cents, 4);
}
