// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{InboxError, Outcome, idempotent};

pub struct Payment {
    pub id: String,
}

// No error type of one's own: `diesel::result::Error` carries inbox errors.
#[idempotent(id = msg.id)]
fn apply(conn: &mut SqliteConnection, msg: &Payment) -> Result<(), diesel::result::Error> {
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(())
}

#[idempotent(id = msg.id, handler = "payments.query_result")]
fn apply_query_result(conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    apply(&mut conn, &Payment { id: "p-1".into() }).unwrap();
    assert!(
        apply_query_result(&mut conn, &Payment { id: "p-1".into() })
            .unwrap()
            .is_processed()
    );
    // A malformed id comes back as a Diesel error that carries the inbox error.
    let error = apply(&mut conn, &Payment { id: "a\0b".into() }).unwrap_err();
    assert!(InboxError::find_in(&error).is_some_and(InboxError::is_invalid_message));
}
