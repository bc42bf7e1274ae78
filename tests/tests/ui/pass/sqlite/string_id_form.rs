// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent};

pub struct Envelope {
    pub message_id: String,
}

pub struct Payment {
    pub envelope: Envelope,
}

// `id = "..."` holds the expression as a string: the same as `id = msg.envelope.message_id`.
#[idempotent(id = "msg.envelope.message_id")]
fn apply(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

#[idempotent(id = "msg.envelope.message_id.as_str()", handler = "payments.as_str")]
fn apply_str(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Payment {
        envelope: Envelope {
            message_id: "m-1".into(),
        },
    };
    assert!(apply(&mut conn, &msg).unwrap().is_processed());
    assert!(apply(&mut conn, &msg).unwrap().is_duplicate());
    apply_str(&mut conn, &msg).unwrap();
}
