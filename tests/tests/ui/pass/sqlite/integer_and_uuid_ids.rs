// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent};
use uuid::Uuid;

pub struct Numbered {
    pub seq: u64,
    pub small: i16,
}

pub struct Tagged {
    pub id: Uuid,
}

#[idempotent(id = msg.seq)]
fn numbered(conn: &mut SqliteConnection, msg: &Numbered) -> QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

#[idempotent(id = msg.small as i64, handler = "ids.small")]
fn small(conn: &mut SqliteConnection, msg: &Numbered) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(id = msg.id)]
fn tagged(conn: &mut SqliteConnection, msg: &Tagged) -> QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let n = Numbered { seq: 42, small: -1 };
    assert!(numbered(&mut conn, &n).unwrap().is_processed());
    assert!(numbered(&mut conn, &n).unwrap().is_duplicate());
    small(&mut conn, &n).unwrap();
    // The producer assigned this UUID: a stable id, read from the message.
    let t = Tagged { id: Uuid::new_v4() };
    assert!(tagged(&mut conn, &t).unwrap().is_processed());
    assert!(tagged(&mut conn, &t).unwrap().is_duplicate());
}
