//! lapin's AMQP `message_id` property as the id, as the client returns it
//! (`&Option<ShortString>`), with no newtype. `BasicProperties` is
//! amq-protocol's, which lapin re-exports as `lapin::BasicProperties`.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use amq_protocol::protocol::BasicProperties;
use diesel::prelude::*;
use inbox_runtime::{InboxError, KeyProblem, Outcome, idempotent};

/// The fields of `lapin::message::Delivery` that matter here.
pub struct Delivery {
    pub delivery_tag: u64,
    pub redelivered: bool,
    pub properties: BasicProperties,
}

#[idempotent(id = delivery.properties.message_id(), handler = "amqp.orders")]
fn on_order(conn: &mut SqliteConnection, delivery: &Delivery) -> QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let properties = BasicProperties::default().with_message_id("order-17".into());
    let first = Delivery {
        delivery_tag: 1,
        redelivered: false,
        properties: properties.clone(),
    };
    assert!(on_order(&mut conn, &first).unwrap().is_processed());
    // The broker redelivers it with a new delivery tag: the same message.
    let again = Delivery {
        delivery_tag: 2,
        redelivered: true,
        properties,
    };
    assert!(on_order(&mut conn, &again).unwrap().is_duplicate());

    // A message published without a `message_id`.
    let anonymous = Delivery {
        delivery_tag: 3,
        redelivered: false,
        properties: BasicProperties::default(),
    };
    let error = on_order(&mut conn, &anonymous).unwrap_err();
    assert!(matches!(
        InboxError::find_in(&error),
        Some(InboxError::InvalidMessageId {
            problem: KeyProblem::Missing,
            ..
        })
    ));
    let _ = (first.delivery_tag, first.redelivered);
}
