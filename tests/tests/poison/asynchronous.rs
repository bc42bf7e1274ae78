//! The async handlers (diesel-async, PostgreSQL and MariaDB/MySQL): the
//! same counting, limit, rejection, panic, not-counted and race behaviours
//! as the blocking ones. The database is read back on a blocking observer
//! connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use diesel::connection::SimpleConnection as _;
use diesel_async::AsyncConnection;
use futures_util::FutureExt;
use inbox_runtime::{AckDecision, InboxError, ack_decision, is_lock_conflict};
use inbox_tests::{ServerBackend, TestBackend, connection_id_async};

use crate::concurrency::{MAX_DELIVERIES, Tally, assert_one_dead_record, tally};
use crate::handlers::*;
use crate::handlers_async::{ScriptedAsync, diesel_typed_async, scripted_async, three_async};
use crate::support::*;

use inbox_tests::transaction_depth_async as depth;

pub async fn async_failures_are_counted_and_the_third_is_fatal<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    for attempt in 1..=2 {
        let msg = Msg::failing("al-1", &format!("boom {attempt}"));
        let result = three_async(&mut conn, &msg).await;
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        assert_eq!(msg.runs(), 1);
        assert_eq!(effects(&mut observer, "al-1"), 0);
        assert_eq!(claims(&mut observer, THREE, "al-1"), 0);
        assert_eq!(
            failure_row::<B>(&mut observer, THREE, "al-1"),
            counted(attempt, &format!("boom {attempt}"))
        );
    }
    let result = three_async(&mut conn, &Msg::failing("al-1", "boom 3")).await;
    assert!(
        matches!(
            result.as_ref().map_err(AppError::inbox),
            Err(Some(InboxError::AttemptsExhausted { attempts: 3, last_error })) if last_error == "boom 3"
        ),
        "{result:?}"
    );
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "al-1"),
        exhausted(3, "boom 3")
    );
    assert_eq!(claims(&mut observer, THREE, "al-1"), 1);
    for later in [Msg::failing("al-1", "boom 4"), Msg::succeeding("al-1")] {
        let result = three_async(&mut conn, &later).await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(later.runs(), 0);
    }
    assert_eq!(effects(&mut observer, "al-1"), 0);

    // Diesel's error type, and a success after failures.
    let result = diesel_typed_async(&mut conn, &Msg::failing("al-2", "")).await;
    assert!(matches!(result, Err(diesel::result::Error::NotFound)));
    assert_eq!(
        failure_row::<B>(&mut observer, DIESEL_TYPED, "al-2"),
        counted(1, "Record not found")
    );
    diesel_typed_async(&mut conn, &Msg::succeeding("al-2"))
        .await
        .expect("processed");
    assert_eq!(effects(&mut observer, "al-2"), 1);
    assert_eq!(
        failure_row::<B>(&mut observer, DIESEL_TYPED, "al-2"),
        counted(1, "Record not found")
    );
}

pub async fn async_rejections_are_dead_at_once<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let result = three_async(&mut conn, &Msg::rejecting("ar-1", "sku 17")).await;
    assert!(
        matches!(&result, Err(AppError::Inbox(InboxError::Rejected { reason })) if reason == "sku 17"),
        "{result:?}"
    );
    assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "ar-1"),
        rejected(1, "sku 17")
    );
    let result = diesel_typed_async(&mut conn, &Msg::rejecting("ar-2", "sku 18")).await;
    let error = result.as_ref().expect_err("rejected");
    assert!(
        matches!(InboxError::find_in(error), Some(InboxError::Rejected { reason }) if reason == "sku 18"),
        "{error:?}"
    );
    assert_eq!(
        failure_row::<B>(&mut observer, DIESEL_TYPED, "ar-2"),
        rejected(1, "sku 18")
    );
    for id in ["ar-1", "ar-2"] {
        assert_eq!(effects(&mut observer, id), 0);
    }
    let later = Msg::succeeding("ar-1");
    three_async(&mut conn, &later).await.unwrap();
    assert_eq!(later.runs(), 0);
    let later = Msg::succeeding("ar-2");
    diesel_typed_async(&mut conn, &later).await.unwrap();
    assert_eq!(later.runs(), 0);
}

pub async fn async_panics_are_counted_at_every_depth<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let cases = [
        ("ap-0", None, "the handler panicked: deliberate panic: boom"),
        (
            "ap-1",
            Some(1),
            "the handler panicked: deliberate panic inside a nested transaction",
        ),
        (
            "ap-2",
            Some(2),
            "the handler panicked: deliberate panic inside a nested transaction",
        ),
    ];
    for (id, nesting, last_error) in cases {
        for attempt in 1..=3 {
            let msg = match nesting {
                None => Msg::panicking(id, "boom"),
                Some(depth) => Msg::new(id, Act::PanicAtDepth(depth)),
            };
            let caught = std::panic::AssertUnwindSafe(three_async(&mut conn, &msg))
                .catch_unwind()
                .await;
            let payload = caught.expect_err("the panic is resumed");
            assert!(panic_text(&*payload).contains("deliberate"));
            assert_eq!(depth(&mut conn), 0, "{id}: back at depth 0");
            assert_eq!(effects(&mut observer, id), 0);
            let row = failure_row::<B>(&mut observer, THREE, id).expect("counted");
            assert_eq!(
                (row.attempts, row.last_error.as_str(), row.dead),
                (attempt, last_error, attempt == 3),
                "{id}"
            );
        }
        let later = Msg::succeeding(id);
        three_async(&mut conn, &later).await.unwrap();
        assert_eq!(later.runs(), 0, "{id} is dead");
    }
    three_async(&mut conn, &Msg::succeeding("ap-after"))
        .await
        .expect("the connection still commits");
    assert_eq!(effects(&mut observer, "ap-after"), 1);
}

/// A lock wait that times out in the body, four times, and failures of a
/// handler nested in the caller's transaction: nothing counted.
pub async fn async_lock_timeouts_and_nested_failures_are_not_counted<B: ServerBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let mut holder = db.connect();
    holder.batch_execute("BEGIN").unwrap();
    holder
        .batch_execute("UPDATE poison_locks SET n = n + 1 WHERE id = 1")
        .unwrap();
    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, short_lock_wait_sql::<B>())
        .await
        .unwrap();
    for _ in 1..=4 {
        let msg = ScriptedAsync {
            id: "alt-1".to_owned(),
            statements: vec!["UPDATE poison_locks SET n = n + 10 WHERE id = 1".to_owned()],
            runs: AtomicU32::new(0),
        };
        let result = scripted_async(&mut conn, &msg).await;
        match &result {
            Err(AppError::Db(error)) => assert!(is_lock_conflict(error), "{error:?}"),
            other => panic!("expected the lock wait to fail, got {other:?}"),
        }
        assert_eq!(ack_decision(&result), AckDecision::Retry);
        assert_eq!(msg.runs.load(Ordering::SeqCst), 1);
    }
    holder.batch_execute("ROLLBACK").unwrap();
    assert_eq!(failure_row::<B>(&mut observer, SCRIPTED, "alt-1"), None);

    conn.transaction(async |conn| {
        for _ in 1..=4 {
            let result = three_async(conn, &Msg::failing("an-1", "nested")).await;
            assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
        }
        let result = three_async(conn, &Msg::rejecting("an-2", "nested")).await;
        assert!(result.is_err());
        crate::handlers_async::write_effect(conn, "caller", "caller").await?;
        Ok::<_, AppError>(())
    })
    .await
    .expect("the caller's transaction commits");
    assert_eq!(all_failure_rows(&mut observer), 0);
    assert_eq!(all_claims(&mut observer), 0);
    assert_eq!(effects(&mut observer, "caller"), 1);
}

/// Tasks on a multi-threaded runtime, each on its own connection, deliver
/// the same always-failing id until it comes back as a duplicate.
pub async fn racing_tasks_make_one_dead_record<B: ServerBackend>() {
    const TASKS: usize = 8;
    let Some((db, _observer)) = fresh::<B>() else {
        return;
    };
    let db = Arc::new(db);
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (db, barrier) = (db.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = db.connect_async().await;
            let mut seen = Tally::default();
            barrier.wait().await;
            for _ in 0..MAX_DELIVERIES {
                let msg = Msg::failing("arace-1", "always failing");
                let result = three_async(&mut conn, &msg).await;
                seen.runs += msg.runs();
                if tally(&mut seen, &result) {
                    return Some(seen);
                }
            }
            None
        }));
    }
    let all = tokio::time::timeout(HANG, futures_util::future::join_all(tasks))
        .await
        .expect("the racing tasks hung");
    let mut total = Tally::default();
    for seen in all {
        total += seen
            .expect("no task panicked")
            .expect("every task ends on a duplicate");
    }
    println!("poison async race {}: tasks={TASKS} {total:?}", B::NAME);
    assert_eq!(total.duplicates as usize, TASKS);
    assert_one_dead_record(&*db, total, "arace-1");
}

/// The async twin of `a_success_racing_a_failure_is_never_dead`.
pub async fn async_success_racing_a_failure_is_never_dead<B: ServerBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    for attempt in 1..=2 {
        let result =
            three_async(&mut conn, &Msg::failing("am-1", &format!("boom {attempt}"))).await;
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    }
    let mut holder = db.connect();
    holder.batch_execute("BEGIN").unwrap();
    holder
        .batch_execute(
            "UPDATE inbox_failures SET attempts = attempts \
             WHERE handler = 'poison.three' AND message_id = 'am-1'",
        )
        .unwrap();
    let mut failing = db.connect_async().await;
    let failing_id = connection_id_async::<B>(&mut failing).await;
    let task = tokio::spawn(async move {
        let msg = Msg::failing("am-1", "boom 3");
        let result = three_async(&mut failing, &msg).await;
        (result, msg.runs())
    });
    wait_until(
        &mut observer,
        &waits_in_sql::<B>(failing_id, "INSERT INTO inbox_failures"),
    );
    let fine = Msg::succeeding("am-1");
    three_async(&mut conn, &fine).await.expect("processed");
    assert_eq!(fine.runs(), 1);
    holder.batch_execute("COMMIT").unwrap();
    let (result, runs) = tokio::time::timeout(HANG, task)
        .await
        .expect("the failing delivery ends")
        .expect("no panic");
    assert_eq!(runs, 1);
    assert!(
        matches!(&result, Err(AppError::Failed(text)) if text == "boom 3"),
        "{result:?}"
    );
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "am-1"),
        counted(2, "boom 2")
    );
    assert_eq!(claims(&mut observer, THREE, "am-1"), 1);
    assert_eq!(effects(&mut observer, "am-1"), 1);
}

/// A deferred foreign key refused at `COMMIT` on diesel-async
/// (PostgreSQL): a failed attempt, counted, dead at the limit, as on a
/// blocking connection (`refused_commit`).
pub async fn an_async_constraint_refused_at_commit_is_a_counted_attempt<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    inbox_tests::create_deferred_foreign_key::<B>(&mut observer);
    let mut conn = db.connect_async().await;
    let delivery = |id: &str, statements: Vec<String>| ScriptedAsync {
        id: id.to_owned(),
        statements,
        runs: std::sync::atomic::AtomicU32::new(0),
    };
    for attempt in 1..=3 {
        let msg = delivery("arc-1", vec![inbox_tests::ORPHAN_SQL.to_owned()]);
        let result = scripted_async(&mut conn, &msg).await;
        let error = result.as_ref().expect_err("the COMMIT is refused");
        let row = failure_row::<B>(&mut observer, SCRIPTED, "arc-1")
            .unwrap_or_else(|| panic!("attempt {attempt} was not counted: {error:?}"));
        assert_eq!((row.attempts, row.dead), (attempt, attempt == 3), "{row:?}");
        let expected = if attempt < 3 {
            AckDecision::Retry
        } else {
            AckDecision::DeadLetter
        };
        assert_eq!(ack_decision(&result), expected, "{error:?}");
        assert_eq!(effects(&mut observer, "arc-1"), 0, "rolled back");
    }
    let later = delivery("arc-1", vec![inbox_tests::ORPHAN_SQL.to_owned()]);
    assert!(scripted_async(&mut conn, &later).await.is_ok());
    scripted_async(&mut conn, &delivery("arc-2", vec![]))
        .await
        .expect("the same connection goes on");
    assert_eq!(effects(&mut observer, "arc-2"), 1);
}

/// The async runner on MariaDB, when the server ended the transaction
/// behind the body's back, as InnoDB does on a deadlock (here the body's
/// own `ROLLBACK` statement stands in for it: the same state, without a
/// race): the body's later write opens a new transaction instead of
/// committing alone (`autocommit` is off), the savepoint's release fails,
/// and nothing commits; the delivery is `IgnoredStatementFailure`, not
/// counted, and its redelivery is processed once.
pub async fn async_a_transaction_the_server_ended_commits_nothing<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let msg = ScriptedAsync {
        id: "aended-1".to_owned(),
        statements: vec![
            "ROLLBACK".to_owned(),
            "INSERT INTO poison_effects (message_id, note) VALUES ('aended-1', 'after')".to_owned(),
        ],
        runs: AtomicU32::new(0),
    };
    let result = scripted_async(&mut conn, &msg).await;
    assert!(
        matches!(
            result,
            Err(AppError::Inbox(InboxError::IgnoredStatementFailure { .. }))
        ),
        "{result:?}"
    );
    assert_eq!(ack_decision(&result), AckDecision::Retry);
    assert_eq!(effects(&mut observer, "aended-1"), 0, "nothing committed");
    assert_eq!(claims(&mut observer, SCRIPTED, "aended-1"), 0);
    assert_eq!(failure_row::<B>(&mut observer, SCRIPTED, "aended-1"), None);
    let again = ScriptedAsync {
        id: "aended-1".to_owned(),
        statements: vec![],
        runs: AtomicU32::new(0),
    };
    scripted_async(&mut conn, &again).await.expect("processed");
    assert_eq!(effects(&mut observer, "aended-1"), 1);
    assert_eq!(claims(&mut observer, SCRIPTED, "aended-1"), 1);
}

inbox_tests::backend_tests! {
    async only [mysql]: async_a_transaction_the_server_ended_commits_nothing;
    async only [postgres, mysql]:
        async_failures_are_counted_and_the_third_is_fatal,
        async_rejections_are_dead_at_once,
        async_panics_are_counted_at_every_depth,
        async_lock_timeouts_and_nested_failures_are_not_counted;
    async (multi_thread = 4) only [postgres, mysql]:
        racing_tasks_make_one_dead_record,
        async_success_racing_a_failure_is_never_dead;
    async only [postgres]: an_async_constraint_refused_at_commit_is_a_counted_attempt;
}
