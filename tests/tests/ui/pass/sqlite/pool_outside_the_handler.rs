// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
#![deny(warnings)]

//! A pool belongs where the handler is called: take the connection from it
//! and pass that. Nothing here is flagged as a second connection.

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use inbox_runtime::{Outcome, idempotent};

type DbPool = Pool<ConnectionManager<SqliteConnection>>;

/// A message.
pub struct Payment {
    /// Its id.
    pub id: String,
}

#[idempotent(id = msg.id)]
fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<Outcome<()>> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(Outcome::Processed(()))
}

#[idempotent(id = msg.id, handler = "payments.pooled")]
fn apply_pooled(
    conn: PooledConnection<ConnectionManager<SqliteConnection>>,
    msg: &Payment,
) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

/// The consumer holds the pool; each delivery takes one connection from it.
fn consume(pool: &DbPool, msg: &Payment) -> QueryResult<Outcome<()>> {
    let mut conn = pool.get().expect("a connection");
    apply_payment(&mut conn, msg)
}

fn main() {
    let pool = Pool::builder()
        .max_size(1)
        .build(ConnectionManager::<SqliteConnection>::new(":memory:"))
        .unwrap();
    inbox_runtime::setup(&mut pool.get().unwrap()).unwrap();
    let msg = Payment { id: "p-1".into() };
    assert!(consume(&pool, &msg).unwrap().is_processed());
    assert!(consume(&pool, &msg).unwrap().is_duplicate());
    apply_pooled(pool.get().unwrap(), &msg).unwrap();
}
