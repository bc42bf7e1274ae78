//! Ids that may be absent (`Option`) and ids read as bytes (a Kafka header,
//! as rdkafka returns it: `Option<&[u8]>`), with no newtype.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{InboxError, KeyProblem, Outcome, idempotent};

pub struct Envelope {
    pub id: Option<String>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Envelope {
    /// A header's value, like rdkafka's `Header { key, value: Option<&[u8]> }`.
    fn header(&self, key: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_slice())
    }
}

#[idempotent(id = msg.id, handler = "ids.optional")]
fn optional(conn: &mut SqliteConnection, msg: &Envelope) -> QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

#[idempotent(id = msg.header("message-id"), handler = "ids.header")]
fn header(conn: &mut SqliteConnection, msg: &Envelope) -> QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

fn problem(result: QueryResult<Outcome<()>>) -> KeyProblem {
    match InboxError::find_in(&result.unwrap_err()) {
        Some(InboxError::InvalidMessageId { problem, .. }) => *problem,
        other => panic!("expected an invalid id, got {other:?}"),
    }
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Envelope {
        id: Some("m-1".into()),
        headers: vec![("message-id".into(), b"h-1".to_vec())],
    };
    assert!(optional(&mut conn, &msg).unwrap().is_processed());
    assert!(optional(&mut conn, &msg).unwrap().is_duplicate());
    assert!(header(&mut conn, &msg).unwrap().is_processed());
    assert!(header(&mut conn, &msg).unwrap().is_duplicate());

    let bad = Envelope {
        id: None,
        headers: vec![("message-id".into(), b"\xff".to_vec())],
    };
    assert_eq!(problem(optional(&mut conn, &bad)), KeyProblem::Missing);
    assert_eq!(
        problem(header(&mut conn, &bad)),
        KeyProblem::NotUtf8 { valid_up_to: 0 }
    );
}
