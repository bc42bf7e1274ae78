//! Business rejections: dead at once, effects rolled back, later
//! deliveries skipped; through the application's error type (the inbox
//! error wrapped `#[error(transparent)]`), a wrapper around that, and
//! Diesel's error type.

use inbox_runtime::{AckDecision, InboxError, ack_decision, dead_letters, idempotent};
use inbox_tests::TestBackend;

use crate::handlers::*;
use crate::support::*;

const REASON: &str = "sku 17 does not exist";

/// An error type around the application's: transparent, and with context.
#[derive(Debug, thiserror::Error)]
pub enum Outer {
    #[error(transparent)]
    App(#[from] AppError),
    #[error("while reserving stock")]
    Context(#[source] AppError),
}

impl From<diesel::result::Error> for Outer {
    fn from(error: diesel::result::Error) -> Self {
        Outer::App(error.into())
    }
}

impl From<InboxError> for Outer {
    fn from(error: InboxError) -> Self {
        Outer::App(error.into())
    }
}

/// Rejects through `Outer`: transparently, or with context (`msg.act` is
/// `Reject` for the first, `Fail` for the second).
#[idempotent(id = msg.id, handler = "poison.outer", max_attempts = 3)]
fn outer<C: diesel::connection::LoadConnection<Backend: inbox_runtime::InboxBackend>>(
    conn: &mut C,
    msg: &Msg,
) -> Result<(), Outer> {
    msg.ran();
    write_effect(conn, &msg.id, "outer")?;
    let rejection = AppError::Inbox(InboxError::rejected(REASON));
    match msg.act {
        Act::Reject(_) => Err(Outer::App(rejection)),
        _ => Err(Outer::Context(rejection)),
    }
}

/// Skipped later deliveries of a dead message, whatever they would do.
fn assert_later_deliveries_are_skipped<B: TestBackend>(conn: &mut B::Connection, id: &str) {
    for later in [
        Msg::succeeding(id),
        Msg::failing(id, "never runs"),
        Msg::rejecting(id, "never runs"),
    ] {
        let result = three(conn, &later);
        assert!(result.is_ok(), "a duplicate: {result:?}");
        assert_eq!(ack_decision(&result), AckDecision::Ack);
        assert_eq!(later.runs(), 0, "a dead message's body does not run");
    }
}

pub fn a_rejection_is_dead_at_once<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let msg = Msg::rejecting("r-1", REASON);
    let result = three(&mut conn, &msg);
    match &result {
        Err(AppError::Inbox(InboxError::Rejected { reason })) => assert_eq!(reason, REASON),
        other => panic!("expected the rejection, got {other:?}"),
    }
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(msg.runs(), 1);
    assert_eq!(effects(&mut observer, "r-1"), 0, "its effect rolled back");
    assert_eq!(claims(&mut observer, THREE, "r-1"), 1, "claimed as dead");
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "r-1"),
        rejected(1, REASON)
    );
    assert_later_deliveries_are_skipped::<B>(&mut conn, "r-1");
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "r-1"),
        rejected(1, REASON)
    );

    let page = dead_letters::list(&mut observer, &handler(THREE), None, 10).unwrap();
    assert_eq!(page.letters.len(), 1);
    let letter = &page.letters[0];
    assert_eq!(
        (
            letter.handler.as_str(),
            letter.message_id.as_str(),
            letter.attempts,
            letter.last_error.as_str(),
            letter.rejected
        ),
        (THREE, "r-1", 1, REASON, true)
    );
    assert!(letter.first_failed_at <= letter.dead_at);
}

/// A rejection after two failed attempts: dead as rejected, not exhausted,
/// with three attempts counted.
pub fn a_rejection_after_failed_attempts<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for attempt in 1..=2 {
        let result = three(&mut conn, &Msg::failing("r-2", &format!("boom {attempt}")));
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    }
    let result = three(&mut conn, &Msg::rejecting("r-2", REASON));
    assert!(
        matches!(&result, Err(AppError::Inbox(InboxError::Rejected { .. }))),
        "{result:?}"
    );
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "r-2"),
        rejected(3, REASON)
    );
    assert_eq!(claims(&mut observer, THREE, "r-2"), 1);
    assert_later_deliveries_are_skipped::<B>(&mut conn, "r-2");
}

/// `Result<_, diesel::result::Error>`: the rejection travels inside a
/// `QueryBuilderError` and is recognised there.
pub fn a_rejection_through_diesels_error_type<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    let msg = Msg::rejecting("r-3", REASON);
    let result = diesel_typed(&mut conn, &msg);
    let error = result.as_ref().expect_err("rejected");
    assert!(
        matches!(
            InboxError::find_in(error),
            Some(InboxError::Rejected { reason }) if reason == REASON
        ),
        "{error:?}"
    );
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(effects(&mut observer, "r-3"), 0);
    assert_eq!(claims(&mut observer, DIESEL_TYPED, "r-3"), 1);
    assert_eq!(
        failure_row::<B>(&mut observer, DIESEL_TYPED, "r-3"),
        rejected(1, REASON)
    );
    let later = Msg::succeeding("r-3");
    assert!(diesel_typed(&mut conn, &later).is_ok());
    assert_eq!(later.runs(), 0);
}

/// A wrapper of the application's error: transparent, and with context of
/// its own (`#[source]`). Both are rejections, kept with their reason.
pub fn a_rejection_through_a_wrapper_of_the_application_error<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for (id, msg) in [
        ("r-4", Msg::rejecting("r-4", REASON)),
        ("r-5", Msg::failing("r-5", "with context")),
    ] {
        let result = outer(&mut conn, &msg);
        assert!(result.is_err());
        assert_eq!(ack_decision(&result), AckDecision::DeadLetter, "{id}");
        assert_eq!(effects(&mut observer, id), 0);
        assert_eq!(claims(&mut observer, "poison.outer", id), 1, "{id}");
        assert_eq!(
            failure_row::<B>(&mut observer, "poison.outer", id),
            rejected(1, REASON),
            "{id}"
        );
        let later = Msg::rejecting(id, REASON);
        assert!(outer(&mut conn, &later).is_ok());
        assert_eq!(later.runs(), 0);
    }
}

inbox_tests::backend_tests!(
    a_rejection_is_dead_at_once,
    a_rejection_after_failed_attempts,
    a_rejection_through_diesels_error_type,
    a_rejection_through_a_wrapper_of_the_application_error,
);
