// The expansion must not depend on what the user's crate calls things.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use std as inbox_runtime;

use ::inbox_runtime::{Outcome, idempotent};
use diesel::prelude::*;

mod __private {}

mod core {}

#[allow(dead_code)]
fn claim_key() {}

#[allow(dead_code)]
fn run_sync() {}

#[allow(dead_code)]
trait HandlerResult {}

pub struct Payment {
    pub id: String,
}

#[idempotent(id = msg.id)]
fn apply(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<Outcome<String>> {
    // Locals with the names the expansion uses internally.
    let __inbox_key = "user's key";
    let __inbox_conn = "user's conn";
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(Outcome::Processed(format!("{__inbox_key} {__inbox_conn}")))
}

#[idempotent(id = msg.id, handler = "shadowing.by_value")]
fn by_value(
    conn: diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<SqliteConnection>>,
    msg: &Payment,
) -> QueryResult<()> {
    let __inbox_conn = 1;
    let _ = (conn, __inbox_conn);
    Ok(())
}

fn main() {
    let _: Option<inbox_runtime::string::String> = None;
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    ::inbox_runtime::setup(&mut conn).unwrap();
    let msg = Payment { id: "p-1".into() };
    assert_eq!(
        apply(&mut conn, &msg).unwrap(),
        Outcome::Processed("user's key user's conn".to_owned())
    );
    assert_eq!(apply(&mut conn, &msg).unwrap(), Outcome::Duplicate);
    let _ = by_value;
}
