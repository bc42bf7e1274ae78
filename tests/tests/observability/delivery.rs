//! Blocking deliveries on SQLite and PostgreSQL, each outcome with its span,
//! events and metrics, checked field by field and counter by counter.

use inbox_runtime::InboxError;
use inbox_tests::{AppError, SqlRows, TestBackend};
use tracing::Level;

use crate::capture::*;
use crate::handlers::*;

pub fn effects<C: SqlRows>(conn: &mut C) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM obs_effects")
}

/// The error text recorded for a dead (or failed) message.
pub fn recorded_error<C: SqlRows>(conn: &mut C, handler: &str, id: &str) -> String {
    let texts = conn.texts(&format!(
        "SELECT last_error AS value FROM inbox_failures WHERE handler = '{handler}' AND message_id = '{id}'"
    ));
    let [text] = &texts[..] else {
        panic!("one failure row for {handler}/{id}: {texts:?}");
    };
    text.clone()
}

pub fn processed_then_duplicate<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = Msg::new("m-1", Mode::Apply);
    let again = Msg::new("m-1", Mode::Apply);
    let ((processed, duplicate), seen, metrics) =
        observed(|| (apply(&mut conn, &first), apply(&mut conn, &again)));
    processed.expect("processed");
    duplicate.expect("a duplicate is Ok");
    assert_eq!((first.runs.get(), again.runs.get()), (1, 0));
    assert_eq!(effects(&mut conn), 1);

    let deliveries = seen.deliveries();
    let [(processed, processed_span), (_, duplicate_span)] = deliveries[..] else {
        panic!("two deliveries: {deliveries:#?}");
    };
    assert_delivery(processed_span, APPLY, "m-1", "processed", None, true);
    assert_delivery(duplicate_span, APPLY, "m-1", "duplicate", None, true);
    assert_eq!(processed_span.parent, None, "no span was current");

    // The body ran inside the delivery's span.
    let body = seen.events_named("body");
    let [body] = body[..] else {
        panic!("the body logged once: {body:#?}");
    };
    assert_eq!(body.span, Some(processed));
    assert!(seen.inbox_events().is_empty(), "{:#?}", seen.events);

    assert_metrics(
        &metrics,
        &[
            (messages(APPLY, "processed"), 1),
            (messages(APPLY, "duplicate"), 1),
        ],
        &[
            (duration(APPLY, "processed"), 1),
            (duration(APPLY, "duplicate"), 1),
            (claim_wait(APPLY), 2),
        ],
    );
    // Seconds, as the milliseconds of the span.
    let seconds = metrics.samples(&duration(APPLY, "processed"))[0];
    let millis = processed_span.fields["inbox.duration_ms"].float();
    assert!(
        seconds > 0.0 && seconds * 1_000.0 <= millis + 1.0,
        "{seconds} s, {millis} ms"
    );
}

/// A span current when the handler is called is the delivery span's parent.
pub fn a_current_span_is_the_parent<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Msg::new("m-2", Mode::Apply);
    let (result, seen, _) =
        observed(|| tracing::info_span!("consumer").in_scope(|| apply(&mut conn, &msg)));
    result.expect("processed");
    let consumer = seen
        .spans
        .iter()
        .position(|span| span.name == "consumer")
        .expect("the consumer's span");
    let deliveries = seen.deliveries();
    let [(_, delivery)] = deliveries[..] else {
        panic!("one delivery: {deliveries:#?}");
    };
    assert_eq!(delivery.parent, Some(consumer));
}

pub fn a_failing_or_panicking_body_is_failed<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let failing = Msg::new("m-f", Mode::Fail);
    let panicking = Msg::new("m-f", Mode::Panic);
    let redelivery = Msg::new("m-f", Mode::Apply);
    let ((failed, panicked, processed), seen, metrics) = observed(|| {
        let failed = apply(&mut conn, &failing);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            apply(&mut conn, &panicking)
        }));
        (failed, panicked, apply(&mut conn, &redelivery))
    });
    assert!(
        matches!(failed, Err(AppError::Failed("boom"))),
        "{failed:?}"
    );
    assert!(panicked.is_err(), "the panic is resumed");
    processed.expect("the redelivery is processed");
    assert_eq!(effects(&mut conn), 1, "only the processed body's effect");

    let deliveries = seen.deliveries();
    let [(_, failed), (_, panicked), (_, processed)] = deliveries[..] else {
        panic!("three deliveries: {deliveries:#?}");
    };
    // The attempt counts are recorded but not read back: no `inbox.attempt`.
    assert_delivery(failed, APPLY, "m-f", "failed", None, true);
    assert_delivery(panicked, APPLY, "m-f", "failed", None, true);
    assert_delivery(processed, APPLY, "m-f", "processed", None, true);
    assert!(seen.inbox_events().is_empty(), "{:#?}", seen.events);
    assert_metrics(
        &metrics,
        &[
            (messages(APPLY, "failed"), 2),
            (messages(APPLY, "processed"), 1),
        ],
        &[
            (duration(APPLY, "failed"), 2),
            (duration(APPLY, "processed"), 1),
            (claim_wait(APPLY), 3),
        ],
    );
}

pub fn a_rejection_is_dead_lettered<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let rejected = Msg::new("m-r", Mode::Reject);
    let redelivery = Msg::new("m-r", Mode::Apply);
    let ((result, duplicate), seen, metrics) =
        observed(|| (apply(&mut conn, &rejected), apply(&mut conn, &redelivery)));
    assert!(
        matches!(result, Err(AppError::Inbox(InboxError::Rejected { ref reason })) if reason == "unknown sku"),
        "{result:?}"
    );
    duplicate.expect("a dead message's redelivery is a duplicate");
    assert_eq!(redelivery.runs.get(), 0);

    let deliveries = seen.deliveries();
    let [(rejected, rejected_span), (_, duplicate_span)] = deliveries[..] else {
        panic!("two deliveries: {deliveries:#?}");
    };
    assert_delivery(rejected_span, APPLY, "m-r", "rejected", None, true);
    assert_delivery(duplicate_span, APPLY, "m-r", "duplicate", None, true);

    // The reason is the one recorded with the dead message (the error's
    // text: the application's error type wraps the rejection).
    let recorded = recorded_error(&mut conn, APPLY, "m-r");
    assert!(recorded.contains("unknown sku"), "{recorded}");
    let events = seen.inbox_events();
    let [event] = events[..] else {
        panic!("one event: {events:#?}");
    };
    assert_eq!(event.name, "inbox.dead_lettered");
    assert_eq!(event.level, Level::WARN);
    assert_eq!(event.span, Some(rejected));
    assert_eq!(
        event.fields,
        Fields::from([
            ("inbox.handler".into(), s(APPLY)),
            ("messaging.message.id".into(), s("m-r")),
            ("inbox.outcome".into(), s("rejected")),
            ("inbox.reason".into(), s(&recorded)),
            (
                "message".into(),
                s("the handler rejected the message; it is recorded as dead")
            ),
        ])
    );
    assert_metrics(
        &metrics,
        &[
            (messages(APPLY, "rejected"), 1),
            (messages(APPLY, "duplicate"), 1),
        ],
        &[
            (duration(APPLY, "rejected"), 1),
            (duration(APPLY, "duplicate"), 1),
            (claim_wait(APPLY), 2),
        ],
    );
}

pub fn exhausted_attempts_are_dead_lettered<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let (first, second, third) = (
        Msg::new("m-x", Mode::Fail),
        Msg::new("m-x", Mode::Fail),
        Msg::new("m-x", Mode::Fail),
    );
    let ((first_result, second_result, third_result), seen, metrics) = observed(|| {
        (
            limited(&mut conn, &first),
            limited(&mut conn, &second),
            limited(&mut conn, &third),
        )
    });
    assert!(matches!(first_result, Err(AppError::Failed("boom"))));
    assert!(
        matches!(
            second_result,
            Err(AppError::Inbox(InboxError::AttemptsExhausted {
                attempts: 2,
                ..
            }))
        ),
        "{second_result:?}"
    );
    third_result.expect("a dead message's redelivery is a duplicate");
    assert_eq!(
        (first.runs.get(), second.runs.get(), third.runs.get()),
        (1, 1, 0)
    );

    let deliveries = seen.deliveries();
    let [(_, failed), (dead, dead_span), (_, duplicate)] = deliveries[..] else {
        panic!("three deliveries: {deliveries:#?}");
    };
    assert_delivery(failed, LIMITED, "m-x", "failed", None, true);
    assert_delivery(dead_span, LIMITED, "m-x", "dead", Some(2), true);
    assert_delivery(duplicate, LIMITED, "m-x", "duplicate", None, true);

    assert_eq!(
        recorded_error(&mut conn, LIMITED, "m-x"),
        "the handler failed: boom"
    );
    let events = seen.inbox_events();
    let [event] = events[..] else {
        panic!("one event: {events:#?}");
    };
    assert_eq!(event.name, "inbox.dead_lettered");
    assert_eq!(event.level, Level::WARN);
    assert_eq!(event.span, Some(dead));
    assert_eq!(
        event.fields,
        Fields::from([
            ("inbox.handler".into(), s(LIMITED)),
            ("messaging.message.id".into(), s("m-x")),
            ("inbox.outcome".into(), s("dead")),
            ("inbox.attempt".into(), Value::U64(2)),
            ("inbox.last_error".into(), s("the handler failed: boom")),
            (
                "message".into(),
                s("the message used up its attempts; it is recorded as dead")
            ),
        ])
    );
    assert_metrics(
        &metrics,
        &[
            (messages(LIMITED, "failed"), 1),
            (messages(LIMITED, "dead"), 1),
            (messages(LIMITED, "duplicate"), 1),
        ],
        &[
            (duration(LIMITED, "failed"), 1),
            (duration(LIMITED, "dead"), 1),
            (duration(LIMITED, "duplicate"), 1),
            (claim_wait(LIMITED), 3),
        ],
    );
}

pub fn an_invalid_id_is_reported_without_a_claim<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let empty = Msg::new("", Mode::Apply);
    let long = Msg::new(&"x".repeat(300), Mode::Apply);
    let ((empty_result, long_result), seen, metrics) =
        observed(|| (apply(&mut conn, &empty), apply(&mut conn, &long)));
    for result in [&empty_result, &long_result] {
        assert!(
            matches!(result, Err(AppError::Inbox(error)) if error.is_invalid_message()),
            "{result:?}"
        );
    }
    assert_eq!((empty.runs.get(), long.runs.get()), (0, 0));

    let deliveries = seen.deliveries();
    let [(_, empty_span), (_, long_span)] = deliveries[..] else {
        panic!("two deliveries: {deliveries:#?}");
    };
    // Never claimed: no claim wait. The id is the error's shortened form.
    assert_delivery(empty_span, APPLY, "", "invalid_id", None, false);
    let shown = format!("{}…", "x".repeat(64));
    assert_delivery(long_span, APPLY, &shown, "invalid_id", None, false);
    assert!(seen.inbox_events().is_empty(), "{:#?}", seen.events);
    assert_metrics(
        &metrics,
        &[(messages(APPLY, "invalid_id"), 2)],
        &[(duration(APPLY, "invalid_id"), 2)],
    );
}

pub fn a_conflict_is_refused_and_counted<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let first = Payload {
        id: "m-c".into(),
        body: "amount=1".into(),
    };
    let changed = Payload {
        id: "m-c".into(),
        body: "amount=2".into(),
    };
    let ((result, conflict), seen, metrics) = observed(|| {
        (
            fingerprinted(&mut conn, &first),
            fingerprinted(&mut conn, &changed),
        )
    });
    result.expect("the first payload is processed");
    let Err(AppError::Inbox(error @ InboxError::Conflict(_))) = &conflict else {
        panic!("a conflict expected: {conflict:?}");
    };
    assert_eq!(effects(&mut conn), 1);

    let deliveries = seen.deliveries();
    let [(_, processed_span), (refused, conflict_span)] = deliveries[..] else {
        panic!("two deliveries: {deliveries:#?}");
    };
    assert_delivery(
        processed_span,
        FINGERPRINTED,
        "m-c",
        "processed",
        None,
        true,
    );
    assert_delivery(conflict_span, FINGERPRINTED, "m-c", "conflict", None, true);
    let events = seen.inbox_events();
    let [event] = events[..] else {
        panic!("one event: {events:#?}");
    };
    assert_eq!(event.name, "inbox.refused");
    assert_eq!(event.level, Level::WARN);
    assert_eq!(event.span, Some(refused));
    assert_eq!(
        event.fields,
        Fields::from([
            ("inbox.handler".into(), s(FINGERPRINTED)),
            ("messaging.message.id".into(), s("m-c")),
            ("inbox.outcome".into(), s("conflict")),
            ("error".into(), s(&error.to_string())),
            (
                "message".into(),
                s("the delivery was refused without running the body; dead-letter it")
            ),
        ])
    );
    assert_metrics(
        &metrics,
        &[
            (messages(FINGERPRINTED, "processed"), 1),
            (messages(FINGERPRINTED, "conflict"), 1),
        ],
        &[
            (duration(FINGERPRINTED, "processed"), 1),
            (duration(FINGERPRINTED, "conflict"), 1),
            (claim_wait(FINGERPRINTED), 2),
        ],
    );
}

/// `describe_metrics` gives the recorder every metric's unit.
pub fn metrics_are_described<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>() else {
        return;
    };
    let msg = Msg::new("m-d", Mode::Apply);
    let (result, _, metrics) = observed(|| {
        inbox_runtime::observe::describe_metrics();
        apply(&mut conn, &msg)
    });
    result.expect("processed");
    use metrics::Unit;
    assert_eq!(
        metrics.units,
        [
            ("inbox_messages_total".to_owned(), Some(Unit::Count)),
            (
                "inbox_handler_duration_seconds".to_owned(),
                Some(Unit::Seconds)
            ),
            ("inbox_claim_wait_seconds".to_owned(), Some(Unit::Seconds)),
        ]
        .into()
    );
    assert!(
        metrics.descriptions.values().all(Option::is_some),
        "{:?}",
        metrics.descriptions
    );
}

inbox_tests::backend_tests!(only [sqlite, postgres]:
    processed_then_duplicate,
    a_current_span_is_the_parent,
    a_failing_or_panicking_body_is_failed,
    a_rejection_is_dead_lettered,
    exhausted_attempts_are_dead_lettered,
    an_invalid_id_is_reported_without_a_claim,
    a_conflict_is_refused_and_counted,
    metrics_are_described,
);
