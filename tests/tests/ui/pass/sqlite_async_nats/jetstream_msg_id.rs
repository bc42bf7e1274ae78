//! The JetStream `Nats-Msg-Id` header as the id, as async-nats returns it
//! (`Option<&HeaderValue>`), with no newtype. A JetStream message derefs to
//! this `async_nats::Message`, so the expression is the same for both.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use async_nats::header::{HeaderMap, HeaderName, NATS_MESSAGE_ID};
use diesel::prelude::*;
use inbox_runtime::{InboxError, KeyProblem, Outcome, idempotent};

#[idempotent(id = message.headers.as_ref().and_then(|h| h.get(NATS_MESSAGE_ID)), handler = "nats.orders")]
fn on_order(
    conn: &mut SqliteConnection,
    message: &async_nats::Message,
) -> QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

/// The header named by its text, as written in the async-nats documentation.
#[idempotent(id = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")), handler = "nats.audit")]
fn audit(conn: &mut SqliteConnection, message: &async_nats::Message) -> QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

fn message(id: Option<&str>) -> async_nats::Message {
    let headers = id.map(|id| {
        let mut headers = HeaderMap::new();
        // Named as the client names a header it receives.
        let name: HeaderName = "Nats-Msg-Id".parse().unwrap();
        headers.insert(name, id);
        headers
    });
    async_nats::Message {
        subject: "orders".into(),
        reply: None,
        payload: Default::default(),
        headers,
        status: None,
        description: None,
        length: 0,
    }
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    assert!(
        on_order(&mut conn, &message(Some("order-17")))
            .unwrap()
            .is_processed()
    );
    assert!(
        on_order(&mut conn, &message(Some("order-17")))
            .unwrap()
            .is_duplicate()
    );
    assert!(
        audit(&mut conn, &message(Some("order-17")))
            .unwrap()
            .is_processed()
    );

    // A message published without the header.
    let error = on_order(&mut conn, &message(None)).unwrap_err();
    assert!(matches!(
        InboxError::find_in(&error),
        Some(InboxError::InvalidMessageId {
            problem: KeyProblem::Missing,
            ..
        })
    ));
}
