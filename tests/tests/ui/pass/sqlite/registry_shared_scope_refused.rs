//! Two handlers of one scope without `shared_scope` compile (the check is
//! at run time: a default scope is only known after expansion, and handlers
//! in other crates are not seen), and every delivery to either is refused
//! with the retryable `InboxError::SharedScope` before anything is claimed.
use diesel::prelude::*;
use inbox_runtime::{AckDecision, InboxError, ack_decision, idempotent, registry};

#[idempotent(id = id, handler = "billing.apply_payment")]
fn apply_payment(conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
    let _ = conn;
    unreachable!("refused")
}

#[idempotent(id = id, handler = "billing.apply_payment")]
fn apply_refund(conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
    let _ = conn;
    unreachable!("refused")
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let shared = registry::check().unwrap_err();
    assert_eq!(shared.0[0].scope, "billing.apply_payment");
    for result in [apply_payment(&mut conn, "m-1"), apply_refund(&mut conn, "m-1")] {
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        let error = result.unwrap_err();
        assert!(matches!(
            InboxError::find_in(&error),
            Some(InboxError::SharedScope { handlers, .. }) if handlers.len() == 2
        ));
    }
}
