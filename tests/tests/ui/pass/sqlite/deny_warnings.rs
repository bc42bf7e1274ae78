// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
#![deny(warnings)]

//! Every supported shape of handler, with warnings denied: the expansion
//! adds no `unused_mut`, `unused_parens`, `unused_variables` or other warning.

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool, PooledConnection};
use inbox_runtime::{InboxBackend, Outcome, idempotent};

type Pooled = PooledConnection<ConnectionManager<SqliteConnection>>;

/// A message.
pub struct Payment {
    /// Its id.
    pub id: String,
    /// Its sequence number.
    pub seq: u32,
}

#[idempotent(id = msg.id)]
fn by_ref(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

#[idempotent(id = msg.seq as u64, handler = "warnings.cast")]
fn cast(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<Outcome<()>> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(Outcome::Processed(()))
}

#[idempotent(id = &msg.id, handler = "warnings.borrowed")]
fn borrowed(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

#[idempotent(id = (msg.seq), handler = "warnings.parens")]
fn parens(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

#[idempotent(id = format!("{}-{}", msg.id, msg.seq), handler = "warnings.format")]
fn formatted(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

#[idempotent(id = msg.id, handler = "warnings.pooled_by_value", conn = conn)]
fn pooled_by_value(conn: Pooled, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

#[idempotent(id = msg.id, handler = "warnings.pooled_mut")]
fn pooled_mut(
    mut conn: PooledConnection<ConnectionManager<SqliteConnection>>,
    msg: &Payment,
) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

#[idempotent(id = msg.id, handler = "warnings.mut_binding")]
fn mut_binding(mut conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
    // Something that needs the binding to be `mut`.
    let binding: &mut &mut SqliteConnection = &mut conn;
    diesel::sql_query("SELECT 1").execute(*binding)?;
    Ok(())
}

#[idempotent(id = msg.id, handler = "warnings.generic")]
fn generic<C>(conn: &mut C, msg: &Payment) -> QueryResult<()>
where
    C: diesel::connection::LoadConnection,
    C::Backend: InboxBackend,
{
    let _ = conn;
    Ok(())
}

#[idempotent(id = msg.id, handler = "warnings.unused_conn")]
fn unused_conn(_conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
    Ok(())
}

/// A stateful handler.
pub struct Billing;

impl Billing {
    #[idempotent(id = msg.id, handler = "warnings.method")]
    fn method(&self, conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
        diesel::sql_query("SELECT 1").execute(conn)?;
        Ok(())
    }
}

fn main() {
    let pool = Pool::builder()
        .max_size(1)
        .build(ConnectionManager::<SqliteConnection>::new(":memory:"))
        .unwrap();
    let mut conn = pool.get().unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Payment {
        id: "p-1".into(),
        seq: 1,
    };
    by_ref(&mut conn, &msg).unwrap();
    assert!(cast(&mut conn, &msg).unwrap().is_processed());
    borrowed(&mut conn, &msg).unwrap();
    parens(&mut conn, &msg).unwrap();
    formatted(&mut conn, &msg).unwrap();
    generic(&mut conn, &msg).unwrap();
    mut_binding(&mut conn, &msg).unwrap();
    unused_conn(&mut conn, &msg).unwrap();
    Billing.method(&mut conn, &msg).unwrap();
    drop(conn);
    pooled_by_value(pool.get().unwrap(), &msg).unwrap();
    pooled_mut(pool.get().unwrap(), &msg).unwrap();
}
