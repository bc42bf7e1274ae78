// The runtime under another name: `crate = "..."` tells the attribute where it is.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
extern crate inbox_runtime as renamed;

use std as inbox_runtime;

use diesel::prelude::*;

mod reexport {
    pub use ::inbox_runtime as inner;
}

pub struct Payment {
    pub id: String,
}

#[renamed::idempotent(id = msg.id, crate = "renamed")]
fn apply(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<renamed::Outcome<()>> {
    let _ = conn;
    Ok(renamed::Outcome::Processed(()))
}

#[reexport::inner::idempotent(id = msg.id, crate = "crate::reexport::inner", handler = "override.reexport")]
fn through_reexport(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {
    let _: Option<inbox_runtime::string::String> = None;
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    renamed::setup(&mut conn).unwrap();
    let msg = Payment { id: "p-1".into() };
    assert!(apply(&mut conn, &msg).unwrap().is_processed());
    assert!(apply(&mut conn, &msg).unwrap().is_duplicate());
    through_reexport(&mut conn, &msg).unwrap();
}
