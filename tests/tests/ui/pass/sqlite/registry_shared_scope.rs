//! `shared_scope`: two versions of one handler share their scope on
//! purpose; the registry's check accepts it and deliveries go through.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent, registry};

#[idempotent(id = id, handler = "orders.reserve", shared_scope)]
fn reserve_v1(conn: &mut SqliteConnection, id: &str) -> QueryResult<Outcome<u8>> {
    let _ = conn;
    Ok(Outcome::Processed(1))
}

#[idempotent(id = id, handler = "orders.reserve", max_attempts = 2, shared_scope)]
fn reserve_v2(conn: &mut SqliteConnection, id: &str) -> QueryResult<Outcome<u8>> {
    let _ = conn;
    Ok(Outcome::Processed(2))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    registry::check().unwrap();
    assert_eq!(registry::shared_scopes().len(), 1);
    assert!(registry::shared_scopes()[0].is_declared());
    assert_eq!(reserve_v1(&mut conn, "m-1").unwrap(), Outcome::Processed(1));
    assert_eq!(reserve_v2(&mut conn, "m-1").unwrap(), Outcome::Duplicate);
}
