// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{InboxError, idempotent};

pub struct Order {
    pub id: String,
    pub sku: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
    #[error(transparent)]
    Inbox(#[from] InboxError),
    #[error("the warehouse did not answer")]
    Warehouse,
}

#[idempotent(id = msg.id, handler = "orders.reserve", max_attempts = 2)]
fn reserve(conn: &mut SqliteConnection, msg: &Order) -> Result<(), AppError> {
    let _ = conn;
    match msg.sku {
        0 => Err(InboxError::rejected("sku 0 does not exist").into()),
        1 => Err(AppError::Warehouse),
        _ => Ok(()),
    }
}

#[idempotent(id = msg.id, handler = "orders.audit", max_attempts = unbounded)]
fn audit(conn: &mut SqliteConnection, msg: &Order) -> Result<(), AppError> {
    let _ = (conn, msg);
    Err(AppError::Warehouse)
}

fn main() {
    use inbox_runtime::{AckDecision, ack_decision};

    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();

    let unknown = Order {
        id: "o-0".into(),
        sku: 0,
    };
    assert_eq!(
        ack_decision(&reserve(&mut conn, &unknown)),
        AckDecision::DeadLetter
    );
    assert_eq!(
        ack_decision(&reserve(&mut conn, &unknown)),
        AckDecision::Ack,
        "dead: skipped"
    );

    let flaky = Order {
        id: "o-1".into(),
        sku: 1,
    };
    assert_eq!(
        ack_decision(&reserve(&mut conn, &flaky)),
        AckDecision::Retry
    );
    assert!(matches!(
        reserve(&mut conn, &flaky),
        Err(AppError::Inbox(InboxError::AttemptsExhausted {
            attempts: 2,
            ..
        }))
    ));

    for _ in 0..10 {
        assert_eq!(ack_decision(&audit(&mut conn, &flaky)), AckDecision::Retry);
    }
}
