// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use inbox_runtime::{Outcome, idempotent};

pub struct Payment {
    pub id: String,
}

// Inside the body `conn` is a `&mut PooledConnection<..>` (the transaction's
// connection): write `.execute(conn)`, not `.execute(&mut conn)`.
#[idempotent(id = msg.id)]
fn apply_payment(
    conn: PooledConnection<ConnectionManager<SqliteConnection>>,
    msg: &Payment,
) -> QueryResult<Outcome<()>> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(Outcome::Processed(()))
}

type Pooled = PooledConnection<ConnectionManager<SqliteConnection>>;

// A `mut` binding works the same way. Behind a type alias whose name does not
// end in `Connection`, name the connection parameter with `conn = ...`.
#[idempotent(id = msg.id, handler = "payments.mut_binding", conn = conn)]
fn apply_payment_mut(mut conn: Pooled, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

fn main() {
    let pool = Pool::builder()
        .max_size(1)
        .build(ConnectionManager::<SqliteConnection>::new(":memory:"))
        .unwrap();
    inbox_runtime::setup(&mut pool.get().unwrap()).unwrap();
    let msg = Payment { id: "p-1".into() };
    assert!(
        apply_payment(pool.get().unwrap(), &msg)
            .unwrap()
            .is_processed()
    );
    assert!(
        apply_payment(pool.get().unwrap(), &msg)
            .unwrap()
            .is_duplicate()
    );
    apply_payment_mut(pool.get().unwrap(), &msg).unwrap();
}
