// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent};

pub struct Event {
    pub id: String,
    pub relevant: bool,
}

// `return` leaves the body (the closure the attribute wraps it in), not the
// transaction wrapper: the claim still commits.
#[idempotent(id = msg.id)]
fn on_event(conn: &mut SqliteConnection, msg: &Event) -> QueryResult<Outcome<&'static str>> {
    if !msg.relevant {
        return Ok(Outcome::Processed("ignored"));
    }
    for _ in 0..3 {
        if msg.id.is_empty() {
            return Ok(Outcome::Processed("unreachable"));
        }
    }
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(Outcome::Processed("handled"))
}

#[idempotent(id = msg.id, handler = "events.unit")]
fn unit(conn: &mut SqliteConnection, msg: &Event) -> QueryResult<()> {
    let _ = conn;
    if msg.relevant {
        return Ok(());
    }
    Ok(())
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let skip = Event {
        id: "e-1".into(),
        relevant: false,
    };
    let take = Event {
        id: "e-2".into(),
        relevant: true,
    };
    assert_eq!(
        on_event(&mut conn, &skip).unwrap(),
        Outcome::Processed("ignored")
    );
    assert_eq!(on_event(&mut conn, &skip).unwrap(), Outcome::Duplicate);
    assert_eq!(
        on_event(&mut conn, &take).unwrap(),
        Outcome::Processed("handled")
    );
    unit(&mut conn, &take).unwrap();
}
