//! A scope declared twice without `shared_scope` is reported, and its
//! deliveries are refused on every backend.

use std::sync::atomic::Ordering;

use inbox_runtime::registry;
use inbox_runtime::{AckDecision, InboxError, Outcome, Recovery, ack_decision};
use inbox_tests::{AppError, SqlRows, TestBackend};

use crate::handlers::{SHARED_RUNS, shared_first, shared_second, version_one, version_two};

#[test]
fn check_reports_the_undeclared_shared_scope_with_its_locations() {
    let shared = registry::shared_scopes();
    let scopes: Vec<(&str, bool)> = shared
        .iter()
        .map(|scope| (scope.scope, scope.is_declared()))
        .collect();
    assert_eq!(
        scopes,
        [("registry.shared", false), ("registry.versions", true)]
    );
    let error = registry::check().expect_err("registry.shared is declared twice");
    assert_eq!(error.shared_scopes.len(), 1);
    assert_eq!(error.shared_scopes[0].scope, "registry.shared");
    assert!(error.hidden_errors.is_empty(), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("registry::handlers::shared_first (tests/tests/registry/handlers.rs:"),
        "{text}"
    );
    assert!(
        text.contains("registry::handlers::shared_second ("),
        "{text}"
    );
    assert!(!text.contains("registry.versions"), "{text}");
}

inbox_tests::backend_tests!(
    a_delivery_under_a_shared_scope_is_refused,
    declared_sharing_is_accepted
);

fn count(conn: &mut impl SqlRows, handler: &str) -> i64 {
    conn.bigint(&format!(
        "SELECT COUNT(*) AS value FROM inbox_messages WHERE handler = '{handler}'"
    ))
}

pub fn a_delivery_under_a_shared_scope_is_refused<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    for result in [
        shared_first(&mut conn, "m-1"),
        shared_second(&mut conn, "m-1"),
    ] {
        let error = result.expect_err("refused");
        let Some(InboxError::SharedScope { handler, handlers }) = error.inbox() else {
            panic!("{error:?}");
        };
        assert_eq!(handler, "registry.shared");
        assert_eq!(handlers.len(), 2, "{handlers:?}");
        assert_eq!(error.recovery(), Recovery::Retry);
        assert_eq!(
            ack_decision(&Err::<(), AppError>(error)),
            AckDecision::Retry
        );
    }
    assert_eq!(count(&mut conn, "registry.shared"), 0, "nothing claimed");
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_failures"),
        0,
        "no failed attempt counted"
    );
    assert_eq!(SHARED_RUNS.load(Ordering::SeqCst), 0, "no body ran");
}

pub fn declared_sharing_is_accepted<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    assert_eq!(
        version_one(&mut conn, "v-1").unwrap(),
        Outcome::Processed(())
    );
    // The other version shares the claims: the same id is a duplicate.
    assert_eq!(version_two(&mut conn, "v-1").unwrap(), Outcome::Duplicate);
    assert_eq!(
        version_two(&mut conn, "v-2").unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(count(&mut conn, "registry.versions"), 2);
}

#[test]
fn the_shared_scope_error_reads() {
    let error = InboxError::SharedScope {
        handler: "billing.apply".into(),
        handlers: vec!["a::f (a.rs:1:1)".into(), "b::g (b.rs:2:1)".into()],
    };
    assert!(error.is_retryable());
    assert_eq!(
        error.to_string(),
        "handler scope `billing.apply` is declared by 2 handlers (a::f (a.rs:1:1), b::g (b.rs:2:1)), \
         so each would skip the messages the others processed; nothing ran: give each its own \
         `handler = \"…\"` (or mark all of them `shared_scope`), deploy, and redeliver"
    );
}
