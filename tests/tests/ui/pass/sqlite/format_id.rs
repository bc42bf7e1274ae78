// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent};

pub struct Record {
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
}

// A composite id: every `format!` argument is read from the message.
#[idempotent(id = format!("{}:{}:{}", msg.topic, msg.partition, msg.offset))]
fn consume(conn: &mut SqliteConnection, msg: &Record) -> QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

#[idempotent(id = std::format!("{p}-{o}", p = msg.partition, o = msg.offset), handler = "records.named")]
fn named(conn: &mut SqliteConnection, msg: &Record) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let a = Record {
        topic: "payments".into(),
        partition: 3,
        offset: 9,
    };
    let b = Record {
        topic: "payments".into(),
        partition: 3,
        offset: 10,
    };
    assert!(consume(&mut conn, &a).unwrap().is_processed());
    assert!(consume(&mut conn, &b).unwrap().is_processed());
    assert!(consume(&mut conn, &a).unwrap().is_duplicate());
    named(&mut conn, &a).unwrap();
}
