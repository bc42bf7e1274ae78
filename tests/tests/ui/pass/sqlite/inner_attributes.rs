// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

// Inner attributes stay at the top of the rewritten body and keep applying to it.
#[idempotent(id = msg.id)]
fn apply(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
    #![allow(unused_variables)]
    #![deny(unused_must_use)]
    let unused = 1;
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

/// Outer doc comments and attributes stay on the function.
#[idempotent(id = msg.id, handler = "inner.outer_attrs")]
#[inline]
#[must_use = "the handler's result says whether it failed"]
fn outer(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    apply(&mut conn, &Payment { id: "p-1".into() }).unwrap();
    outer(&mut conn, &Payment { id: "p-1".into() }).unwrap();
}
