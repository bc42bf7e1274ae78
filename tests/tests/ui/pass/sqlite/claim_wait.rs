// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent};

pub struct Payment {
    pub id: String,
}

/// A copy of a slow message waits at most half a second for it.
#[idempotent(id = msg.id, handler = "payments.short_wait", claim_wait = "500ms")]
fn short_wait(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<Outcome<()>> {
    let _ = (conn, msg);
    Ok(Outcome::Processed(()))
}

/// Today's behaviour: a copy waits for the first delivery to end.
#[idempotent(id = msg.id, handler = "payments.wait", claim_wait = unbounded, max_attempts = 3)]
fn waits(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<Outcome<()>> {
    let _ = (conn, msg);
    Ok(Outcome::Processed(()))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Payment { id: "p-1".into() };
    assert_eq!(short_wait(&mut conn, &msg).unwrap(), Outcome::Processed(()));
    assert_eq!(short_wait(&mut conn, &msg).unwrap(), Outcome::Duplicate);
    assert_eq!(waits(&mut conn, &msg).unwrap(), Outcome::Processed(()));
}
