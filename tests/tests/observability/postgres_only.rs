//! What only PostgreSQL shows: a commit the database refuses
//! (`database_error`), a claim that loses a serialization failure and is
//! retried, and an async handler on diesel-async.

use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use inbox_runtime::InboxError;
use inbox_tests::{AppError, Postgres, ServerBackend, SqlRows, TestBackend, connection_id};
use tracing::Level;

use crate::capture::*;
use crate::handlers::*;

#[test]
fn a_refused_commit_is_a_database_error() {
    let Some((_db, mut conn)) = fresh::<Postgres>() else {
        return;
    };
    let msg = Msg::new("m-db", Mode::IgnoreFailedStatement);
    let (result, seen, metrics) = observed(|| apply(&mut conn, &msg));
    let error = result.expect_err("nothing could commit");
    assert!(
        matches!(
            error,
            AppError::Inbox(InboxError::IgnoredStatementFailure { .. })
        ),
        "{error:?}"
    );

    let deliveries = seen.deliveries();
    let [(delivery, span)] = deliveries[..] else {
        panic!("one delivery: {deliveries:#?}");
    };
    assert_delivery(span, APPLY, "m-db", "database_error", None, true);
    let events = seen.inbox_events();
    let [event] = events[..] else {
        panic!("one event: {events:#?}");
    };
    assert_eq!(event.name, "inbox.database_error");
    assert_eq!(event.level, Level::WARN);
    assert_eq!(event.span, Some(delivery));
    assert_eq!(
        event.fields,
        Fields::from([
            ("inbox.handler".into(), s(APPLY)),
            ("messaging.message.id".into(), s("m-db")),
            ("error".into(), s(&error.to_string())),
            (
                "message".into(),
                s("the inbox's database work failed; nothing of the delivery committed")
            ),
        ])
    );
    assert_metrics(
        &metrics,
        &[(messages(APPLY, "database_error"), 1)],
        &[
            (duration(APPLY, "database_error"), 1),
            (claim_wait(APPLY), 1),
        ],
    );
}

/// At REPEATABLE READ, a claim that waited on a concurrent claim of the same
/// id which then committed fails with a serialization failure; the runtime
/// claims again in a new transaction, which finds a duplicate.
#[test]
fn a_claim_retry_is_reported() {
    let Some((db, mut conn)) = fresh::<Postgres>() else {
        return;
    };
    conn.batch_execute(
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ",
    )
    .unwrap();
    let handler_pid = connection_id::<Postgres>(&mut conn);
    let mut other = db.connect();
    other
        .batch_execute(&format!(
            "BEGIN; INSERT INTO inbox_messages (handler, message_id) VALUES ('{APPLY}', 'm-c')"
        ))
        .unwrap();
    let delivery = thread::spawn(move || {
        let msg = Msg::new("m-c", Mode::Apply);
        let (result, seen, metrics) = observed(|| apply(&mut conn, &msg));
        (
            result.map_err(|error| error.to_string()),
            msg.runs.get(),
            seen,
            metrics,
        )
    });
    let mut watcher = db.connect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let waiting = format!(
        "SELECT {} AS value",
        Postgres::lock_waiters_sql(&[handler_pid])
    );
    while watcher.bigint(&waiting) == 0 {
        assert!(Instant::now() < deadline, "the claim never waited");
        thread::sleep(Duration::from_millis(5));
    }
    // Long enough to show in the claim wait.
    thread::sleep(Duration::from_millis(100));
    other.batch_execute("COMMIT").unwrap();
    let (result, runs, seen, metrics) = delivery.join().expect("the delivery thread");
    assert_eq!(result, Ok(()));
    assert_eq!(runs, 0, "a duplicate: the body did not run");

    let deliveries = seen.deliveries();
    let [(delivery, span)] = deliveries[..] else {
        panic!("one delivery: {deliveries:#?}");
    };
    assert_delivery(span, APPLY, "m-c", "duplicate", None, true);
    let wait = span.fields["inbox.claim_wait_ms"].float();
    assert!(wait >= 100.0, "the claim waited {wait} ms");
    let events = seen.inbox_events();
    let [event] = events[..] else {
        panic!("one event: {events:#?}");
    };
    assert_eq!(event.name, "inbox.claim_retry");
    assert_eq!(event.level, Level::DEBUG);
    assert_eq!(event.span, Some(delivery));
    assert_eq!(
        event.fields.keys().collect::<Vec<_>>(),
        ["error", "inbox.claim_try", "message"]
    );
    assert_eq!(event.fields["inbox.claim_try"], Value::U64(2));
    let error = event.fields["error"].text();
    assert!(error.starts_with("could not serialize access"), "{error}");
    assert_metrics(
        &metrics,
        &[
            (messages(APPLY, "duplicate"), 1),
            (key("inbox_claim_retries_total", &[("handler", APPLY)]), 1),
        ],
        &[(duration(APPLY, "duplicate"), 1), (claim_wait(APPLY), 1)],
    );
    let [seconds] = metrics.samples(&claim_wait(APPLY)) else {
        unreachable!()
    };
    assert!(*seconds >= 0.1, "{seconds} s");
}

#[cfg(feature = "async")]
mod asynchronous {
    use diesel_async::RunQueryDsl;
    use inbox_runtime::InboxError;
    use inbox_tests::{AppError, AsyncSqlRows, TestBackend, statement};
    use tracing::Level;

    use crate::capture::*;
    use crate::handlers::*;

    /// An async handler's deliveries, each in its span across the body's
    /// awaits, with the blocking runner's fields, events and metrics.
    pub async fn async_deliveries<B: TestBackend>() {
        let Some(db) = B::open() else {
            return;
        };
        let mut conn = db.connect_async().await;
        statement(EFFECTS_DDL).execute(&mut conn).await.unwrap();
        let messages_sent = [
            Msg::new("a-1", Mode::Apply),
            Msg::new("a-1", Mode::Apply),
            Msg::new("a-2", Mode::Reject),
            Msg::new("a-3", Mode::Fail),
            Msg::new("", Mode::Apply),
        ];
        let observation = Observation::new();
        let guards = observation.install();
        let mut results = Vec::new();
        for msg in &messages_sent {
            results.push(apply_async(&mut conn, msg).await);
        }
        drop(guards);
        let (seen, metrics) = observation.seen();

        assert!(results[0].is_ok() && results[1].is_ok());
        assert!(
            matches!(
                results[2],
                Err(AppError::Inbox(InboxError::Rejected { .. }))
            ),
            "{:?}",
            results[2]
        );
        assert!(matches!(results[3], Err(AppError::Failed("boom"))));
        assert!(matches!(&results[4], Err(AppError::Inbox(error)) if error.is_invalid_message()));
        let runs: Vec<u32> = messages_sent.iter().map(|msg| msg.runs.get()).collect();
        assert_eq!(runs, [1, 0, 1, 1, 0]);

        let deliveries = seen.deliveries();
        let [
            (processed, processed_span),
            (_, duplicate),
            (rejected, rejected_span),
            (failed, failed_span),
            (_, invalid),
        ] = deliveries[..]
        else {
            panic!("five deliveries: {deliveries:#?}");
        };
        assert_delivery(processed_span, APPLY, "a-1", "processed", None, true);
        assert_delivery(duplicate, APPLY, "a-1", "duplicate", None, true);
        assert_delivery(rejected_span, APPLY, "a-2", "rejected", None, true);
        assert_delivery(failed_span, APPLY, "a-3", "failed", None, true);
        assert_delivery(invalid, APPLY, "", "invalid_id", None, false);

        // Each body logged after an await, inside its delivery's span.
        let bodies: Vec<_> = seen.events_named("body").iter().map(|e| e.span).collect();
        assert_eq!(bodies, [Some(processed), Some(rejected), Some(failed)]);

        let events = seen.inbox_events();
        let [event] = events[..] else {
            panic!("one event: {events:#?}");
        };
        assert_eq!(event.name, "inbox.dead_lettered");
        assert_eq!(event.level, Level::WARN);
        assert_eq!(event.span, Some(rejected));
        let recorded = conn
            .texts("SELECT last_error AS value FROM inbox_failures WHERE message_id = 'a-2'")
            .await;
        assert_eq!(event.fields["inbox.reason"], s(&recorded[0]));
        assert!(recorded[0].contains("unknown sku"), "{recorded:?}");
        assert_eq!(event.fields["messaging.message.id"], s("a-2"));

        assert_metrics(
            &metrics,
            &[
                (messages(APPLY, "processed"), 1),
                (messages(APPLY, "duplicate"), 1),
                (messages(APPLY, "rejected"), 1),
                (messages(APPLY, "failed"), 1),
                (messages(APPLY, "invalid_id"), 1),
            ],
            &[
                (duration(APPLY, "processed"), 1),
                (duration(APPLY, "duplicate"), 1),
                (duration(APPLY, "rejected"), 1),
                (duration(APPLY, "failed"), 1),
                (duration(APPLY, "invalid_id"), 1),
                (claim_wait(APPLY), 4),
            ],
        );
    }

    inbox_tests::backend_tests!(async only [postgres]: async_deliveries);
}
