//! Two handlers of one scope without `shared_scope` compile (the check is
//! at run time: a default scope is only known after expansion, and handlers
//! in other crates are not seen), and every delivery to either is refused
//! with the retryable `InboxError::SharedScope` before anything is claimed.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
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
    let problems = registry::check().unwrap_err();
    assert_eq!(problems.shared_scopes[0].scope, "billing.apply_payment");
    assert!(problems.hidden_errors.is_empty());
    for result in [
        apply_payment(&mut conn, "m-1"),
        apply_refund(&mut conn, "m-1"),
    ] {
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        let error = result.unwrap_err();
        assert!(matches!(
            InboxError::find_in(&error),
            Some(InboxError::SharedScope { handlers, .. }) if handlers.len() == 2
        ));
    }
}
