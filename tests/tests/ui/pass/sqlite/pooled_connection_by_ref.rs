// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use inbox_runtime::{Outcome, idempotent};

type Pooled = PooledConnection<ConnectionManager<SqliteConnection>>;

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
fn apply_payment(conn: &mut Pooled, msg: &Payment) -> QueryResult<Outcome<()>> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(Outcome::Processed(()))
}

fn main() {
    // One connection, so every checkout sees the same in-memory database.
    let pool = Pool::builder()
        .max_size(1)
        .build(ConnectionManager::<SqliteConnection>::new(":memory:"))
        .unwrap();
    let mut conn = pool.get().unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Payment { id: "p-1".into() };
    assert!(apply_payment(&mut conn, &msg).unwrap().is_processed());
    assert!(apply_payment(&mut conn, &msg).unwrap().is_duplicate());
}
