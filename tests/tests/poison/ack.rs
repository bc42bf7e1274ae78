//! `ack_decision` end to end, for every outcome of a real delivery:
//! through the application's error type, a wrapper with context around it,
//! and Diesel's error type. (Database trouble in the body: `Retry`, checked
//! in `not_counted`.)

use inbox_runtime::{AckDecision, Acknowledge, InboxError, ack_decision};
use inbox_tests::TestBackend;

use crate::handlers::*;
use crate::support::*;

/// A consumer's wrapper with context, whose `source()` is the handler's
/// error.
#[derive(Debug)]
struct Context(AppError);

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the order consumer failed")
    }
}

impl std::error::Error for Context {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// The decision for `result`, checked to be the same through [`Context`].
fn decide(result: Result<(), AppError>) -> AckDecision {
    let direct = ack_decision(&result);
    assert_eq!(result.ack_decision(), direct);
    let wrapped = result.map_err(Context);
    assert_eq!(
        ack_decision(&wrapped),
        direct,
        "through a wrapper: {wrapped:?}"
    );
    direct
}

pub fn ack_decision_for_each_outcome<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    use AckDecision::*;
    let mut deliver = |msg: Msg| decide(three(&mut conn, &msg));
    assert_eq!(deliver(Msg::succeeding("a-1")), Ack, "processed");
    assert_eq!(deliver(Msg::succeeding("a-1")), Ack, "duplicate");
    assert_eq!(
        deliver(Msg::failing("a-2", "boom")),
        Retry,
        "failed attempt"
    );
    assert_eq!(
        deliver(Msg::failing("a-2", "boom")),
        Retry,
        "failed attempt"
    );
    assert_eq!(
        deliver(Msg::failing("a-2", "boom")),
        DeadLetter,
        "exhausted"
    );
    assert_eq!(
        deliver(Msg::failing("a-2", "boom")),
        Ack,
        "dead: a duplicate"
    );
    assert_eq!(
        deliver(Msg::rejecting("a-3", "bad")),
        DeadLetter,
        "rejected"
    );
    assert_eq!(
        deliver(Msg::rejecting("a-3", "bad")),
        Ack,
        "rejected: a duplicate"
    );
    let invalid = Msg::succeeding("");
    let result = three(&mut conn, &invalid);
    assert!(
        matches!(
            &result,
            Err(AppError::Inbox(InboxError::InvalidMessageId { .. }))
        ),
        "{result:?}"
    );
    assert_eq!(invalid.runs(), 0);
    assert_eq!(decide(result), DeadLetter, "an invalid id");

    // Diesel's error type.
    let mut deliver = |msg: Msg| ack_decision(&diesel_typed(&mut conn, &msg));
    assert_eq!(deliver(Msg::succeeding("d-1")), Ack);
    assert_eq!(deliver(Msg::succeeding("d-1")), Ack);
    assert_eq!(deliver(Msg::failing("d-2", "")), Retry);
    assert_eq!(deliver(Msg::failing("d-2", "")), Retry);
    assert_eq!(deliver(Msg::failing("d-2", "")), DeadLetter);
    assert_eq!(deliver(Msg::failing("d-2", "")), Ack);
    assert_eq!(deliver(Msg::rejecting("d-3", "bad")), DeadLetter);
    assert_eq!(deliver(Msg::succeeding("")), DeadLetter);
}

inbox_tests::backend_tests!(ack_decision_for_each_outcome);
