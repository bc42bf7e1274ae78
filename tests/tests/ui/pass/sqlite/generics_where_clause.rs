// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use std::fmt::Display;

use diesel::connection::LoadConnection;
use diesel::prelude::*;
use inbox_runtime::{InboxBackend, MessageId, Outcome, idempotent};

pub struct Envelope<I> {
    pub id: I,
    pub body: String,
}

// Generic over the connection (any backend the inbox supports; every Diesel
// connection is a `LoadConnection`) and the id.
#[idempotent(id = msg.id, handler = "generic.handle")]
pub fn handle<'m, C, I>(conn: &mut C, msg: &'m Envelope<I>) -> QueryResult<Outcome<&'m str>>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: MessageId + Display,
{
    let _ = conn;
    Ok(Outcome::Processed(&msg.body))
}

// The same with bounds inline.
#[idempotent(id = msg.id)]
pub fn handle_inline<C: LoadConnection<Backend = diesel::sqlite::Sqlite>, I: MessageId>(
    conn: &mut C,
    msg: &Envelope<I>,
) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Envelope {
        id: 7_u64,
        body: "hello".to_owned(),
    };
    assert_eq!(
        handle(&mut conn, &msg).unwrap(),
        Outcome::Processed("hello")
    );
    assert_eq!(handle(&mut conn, &msg).unwrap(), Outcome::Duplicate);
    handle_inline(
        &mut conn,
        &Envelope {
            id: "x",
            body: String::new(),
        },
    )
    .unwrap();
}
