//! `run_idempotent_batch_async` on diesel-async connections (PostgreSQL and
//! MariaDB/MySQL): the blocking form's guarantees through the same driver —
//! processed and duplicates, copies and invalid ids, a failed body split off
//! and counted alone, a rejection, a panic resumed after the messages before
//! it committed, a killed connection aborting the batch, a future dropped at
//! every await point leaving nothing half done and the connection refused,
//! deliveries racing overlapping batches, and a deferred foreign key refused
//! at `COMMIT` (the culprit split off and counted). The database is read back on a blocking observer
//! connection.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use diesel_async::{AsyncConnection, RunQueryDsl};
use futures_util::FutureExt;
use inbox_runtime::{
    AckDecision, BatchReport, InboxError, MaxAttempts, Outcome, Recovery, ack_decision,
    run_idempotent_batch_async_with,
};
use inbox_tests::{
    CancelAfter, ServerBackend, TestBackend, connection_id_async, statement, terminate_async,
};

use crate::support::*;

/// Applies the effect of `id` on an async connection.
async fn apply_async<C: AsyncConnection>(conn: &mut C, id: &str) -> Result<(), AppError> {
    let sql = format!(
        "INSERT INTO batch_effects (message_id, note) VALUES ({}, 'applied')",
        literal(id)
    );
    statement(sql).execute(conn).await?;
    Ok(())
}

/// What a body does besides applying its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Apply,
    Fail,
    Reject,
    Panic,
    /// Also writes a row a deferred foreign key refuses at `COMMIT`.
    Orphan,
}

/// Runs `ids` as one async batch of [`HANDLER`]; `act` says what each id's
/// body does. Returns the report and how often each body ran.
async fn run_async<C>(
    conn: &mut C,
    ids: &[String],
    max_attempts: MaxAttempts,
    act: impl Fn(&str) -> Act,
) -> (BatchReport<String, AppError>, Runs)
where
    C: AsyncConnection<Backend: inbox_runtime::InboxBackend>,
{
    let runs = Mutex::new(Runs::new());
    let report = run_idempotent_batch_async_with(
        conn,
        &handler(),
        ids,
        |id| id,
        max_attempts,
        async |conn: &mut C, id: &String| {
            *runs.lock().unwrap().entry(id.clone()).or_default() += 1;
            apply_async(conn, id).await?;
            match act(id) {
                Act::Apply => Ok(id.clone()),
                Act::Fail => Err(AppError::Failed("boom")),
                Act::Reject => Err(InboxError::rejected(format!("{id} is bad")).into()),
                Act::Panic => panic!("deliberate panic in {id}"),
                Act::Orphan => {
                    statement(inbox_tests::ORPHAN_SQL.to_owned())
                        .execute(conn)
                        .await?;
                    Ok(id.clone())
                }
            }
        },
    )
    .await;
    (report, runs.into_inner().unwrap())
}

pub async fn async_batches_process_new_ids_and_skip_redeliveries<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let mut batch = ids("async", 6);
    batch.push(batch[2].clone());
    batch.push(String::new());
    let (report, runs) = run_async(&mut conn, &batch, MaxAttempts::limit(3), |_| Act::Apply).await;
    assert_eq!(report.processed(), 6, "{:?}", endings(&report));
    assert!(matches!(report.results()[6], Ok(Outcome::Duplicate)));
    match &report.results()[7] {
        Err(AppError::Inbox(InboxError::InvalidMessageId { .. })) => {}
        other => panic!("the empty id: {other:?}"),
    }
    assert_eq!(ack_decision(&report.results()[7]), AckDecision::DeadLetter);
    assert!(runs.values().all(|n| *n == 1), "{runs:?}");
    assert_eq!(all_effects(&mut observer), 6);
    assert_eq!(all_claims(&mut observer), 6);

    let (again, runs) = run_async(&mut conn, &batch[..6], MaxAttempts::limit(3), |_| {
        Act::Apply
    })
    .await;
    assert_all_duplicates(&again);
    assert!(runs.is_empty(), "no body ran again: {runs:?}");
    assert_eq!(all_effects(&mut observer), 6);
}

pub async fn async_failures_are_split_off_and_counted_alone<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let batch = ids("split", 8);
    let (failing, rejected_id) = (batch[3].clone(), batch[5].clone());
    let act = |id: &str| match id {
        id if id == failing => Act::Fail,
        id if id == rejected_id => Act::Reject,
        _ => Act::Apply,
    };
    let (report, runs) = run_async(&mut conn, &batch, MaxAttempts::limit(2), act).await;
    assert_eq!(report.processed(), 6, "{:?}", endings(&report));
    assert_eq!(ack_decision(&report.results()[3]), AckDecision::Retry);
    assert_eq!(ack_decision(&report.results()[5]), AckDecision::DeadLetter);
    assert_eq!(runs[&failing], 2, "once in the batch, once alone");
    assert_eq!(
        failure_row::<B>(&mut observer, &failing),
        counted(1, "the handler failed: boom"),
        "counted once: alone"
    );
    assert_eq!(
        failure_row::<B>(&mut observer, &rejected_id),
        rejected(1, &format!("{rejected_id} is bad"))
    );
    assert_eq!(
        all_effects(&mut observer),
        6,
        "the failed bodies' effects rolled back"
    );

    // Redelivered: the failure reaches the limit, the rest are duplicates.
    let (again, _) = run_async(&mut conn, &batch, MaxAttempts::limit(2), act).await;
    match &again.results()[3] {
        Err(AppError::Inbox(InboxError::AttemptsExhausted { attempts: 2, .. })) => {}
        other => panic!("exhausted: {other:?}"),
    }
    assert_eq!(again.duplicates(), 7, "{:?}", endings(&again));
    assert_eq!(
        failure_row::<B>(&mut observer, &failing),
        exhausted(2, "the handler failed: boom")
    );
}

pub async fn async_panics_are_counted_and_resumed<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let batch = ids("panic", 6);
    let panicking = batch[2].clone();
    let act = |id: &str| {
        if id == panicking {
            Act::Panic
        } else {
            Act::Apply
        }
    };
    let caught =
        std::panic::AssertUnwindSafe(run_async(&mut conn, &batch, MaxAttempts::limit(3), act))
            .catch_unwind()
            .await;
    assert!(caught.is_err(), "the panic is resumed");
    for id in &batch[..2] {
        assert_eq!(
            effects(&mut observer, id),
            1,
            "{id}: committed before the panic"
        );
    }
    for id in &batch[2..] {
        assert_eq!(effects(&mut observer, id), 0, "{id}");
    }
    let row = failure_row::<B>(&mut observer, &panicking).expect("the panic was counted");
    assert_eq!(row.attempts, 1);
    // The connection is usable: the rest is delivered again.
    let (again, _) = run_async(&mut conn, &batch, MaxAttempts::limit(3), |_| Act::Apply).await;
    assert_eq!((again.processed(), again.duplicates()), (4, 2));
}

pub async fn async_killed_connection_aborts_the_batch<B: ServerBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let mut killer = db.connect_async().await;
    let victim = connection_id_async::<B>(&mut conn).await;
    let batch = ids("killed", 6);
    let fourth = batch[3].clone();
    let killer = Mutex::new(Some(&mut killer));
    let report = run_idempotent_batch_async_with(
        &mut conn,
        &handler(),
        &batch,
        |id| id,
        MaxAttempts::limit(1),
        async |conn: &mut B::AsyncConnection, id: &String| {
            if *id == fourth {
                let killer = killer.lock().unwrap().take().expect("killed once");
                terminate_async::<B>(killer, victim).await;
            }
            apply_async(conn, id).await?;
            Ok::<_, AppError>(id.clone())
        },
    )
    .await;
    let error = report.results()[3]
        .as_ref()
        .expect_err("the fourth's error");
    assert_eq!(error.recovery(), Recovery::Reconnect, "{error:?}");
    for (index, result) in report.results().iter().enumerate() {
        assert_eq!(
            ack_decision(result),
            AckDecision::Retry,
            "{index}: {result:?}"
        );
        if index != 3 {
            assert!(
                matches!(
                    result,
                    Err(AppError::Inbox(InboxError::BatchAborted {
                        recovery: Recovery::Reconnect,
                        ..
                    }))
                ),
                "{index}: {result:?}"
            );
        }
    }
    assert_eq!(all_claims(&mut observer), 0);
    assert_eq!(all_effects(&mut observer), 0);
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");
    let mut fresh_conn = db.connect_async().await;
    let (again, _) = run_async(&mut fresh_conn, &batch, MaxAttempts::limit(1), |_| {
        Act::Apply
    })
    .await;
    assert_all_processed(&again, &batch);
}

/// Drops the batch's future after each number of waits in turn, until it
/// completes: every cancelled attempt leaves each message's claim and
/// effect together (both or neither), the connection refuses further
/// transactions, and the redelivery applies every effect exactly once.
pub async fn async_cancellation_at_every_await_point_leaves_nothing_half_done<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let handler = handler();
    let mut cancelled_points = 0;
    for polls in 0.. {
        assert!(polls < 200, "the batch never completed");
        let batch = ids(&format!("cancel-{polls}"), 4);
        let mut conn = db.connect_async().await;
        let delivery = run_idempotent_batch_async_with(
            &mut conn,
            &handler,
            &batch,
            |id| id,
            MaxAttempts::limit(3),
            async |conn: &mut B::AsyncConnection, id: &String| {
                apply_async(conn, id).await?;
                Ok::<_, AppError>(id.clone())
            },
        );
        let finished = CancelAfter::new(delivery, polls).await.is_some();
        if !finished {
            cancelled_points += 1;
            let (refused, runs) =
                run_async(&mut conn, &ids("after", 2), MaxAttempts::limit(3), |_| {
                    Act::Apply
                })
                .await;
            assert!(runs.is_empty(), "nothing runs on a cancelled connection");
            match &refused.results()[0] {
                Err(AppError::Db(diesel::result::Error::BrokenTransactionManager)) => {}
                other => panic!("a cancelled connection must refuse new work: {other:?}"),
            }
            for result in refused.results() {
                assert_eq!(ack_decision(result), AckDecision::Retry, "{result:?}");
            }
        }
        drop(conn);
        for id in &batch {
            let (effects, claims) = effects_and_claims(&mut observer, id);
            assert_eq!(
                effects, claims,
                "{id}: claim and effect commit together (after {polls} waits)"
            );
        }
        let mut fresh_conn = db.connect_async().await;
        let (again, _) = run_async(&mut fresh_conn, &batch, MaxAttempts::limit(3), |_| {
            Act::Apply
        })
        .await;
        assert_eq!(again.failed(), 0, "{:?}", endings(&again));
        for id in &batch {
            assert_eq!(
                effects(&mut observer, id),
                1,
                "{id}: exactly once after {polls} waits"
            );
        }
        if finished {
            break;
        }
    }
    assert!(
        cancelled_points >= 4,
        "only {cancelled_points} await points were exercised"
    );
    println!(
        "async batch cancellation {}: cancelled at {cancelled_points} await points",
        B::NAME
    );
}

/// Deliveries on connections of their own deliver overlapping, shuffled
/// batches of the same ids, redelivering what is to be retried: every id's
/// effect is applied exactly once.
pub async fn async_racing_batches_apply_each_effect_once<B: TestBackend>() {
    const TASKS: usize = 6;
    const IDS: usize = 120;
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let all = ids("race", IDS);
    let processed = Arc::new(Mutex::new(BTreeMap::<String, u32>::new()));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let mut conn = db.connect_async().await;
        let mut order = all.clone();
        Rng::new(task as u64 + 1).shuffle(&mut order);
        let processed = Arc::clone(&processed);
        tasks.push(async move {
            let mut pending: Vec<String> = order;
            let mut deliveries = 0;
            while !pending.is_empty() {
                deliveries += 1;
                assert!(deliveries < 500, "task {task} livelocked");
                let size = 10 + (deliveries * 7 + task * 3) % 30;
                let take = size.min(pending.len());
                let batch: Vec<String> = pending.drain(..take).collect();
                let (report, _) =
                    run_async(&mut conn, &batch, MaxAttempts::Unbounded, |_| Act::Apply).await;
                for (id, result) in batch.iter().zip(report.results()) {
                    match (result, ack_decision(result)) {
                        (Ok(Outcome::Processed(_)), _) => {
                            *processed.lock().unwrap().entry(id.clone()).or_default() += 1;
                        }
                        (Ok(Outcome::Duplicate), _) => {}
                        (Err(_), AckDecision::Retry) => pending.push(id.clone()),
                        (Err(error), decision) => panic!("{id}: {decision:?} {error}"),
                    }
                }
            }
        });
    }
    // Polled together on this task: each on its own connection, so the
    // database sees them race.
    futures_util::future::join_all(tasks).await;
    let processed = processed.lock().unwrap();
    assert_eq!(processed.len(), IDS, "every id processed by someone");
    assert!(processed.values().all(|n| *n == 1), "{processed:?}");
    for id in &all {
        assert_eq!(effects(&mut observer, id), 1, "{id}");
    }
    assert_eq!(all_claims(&mut observer), IDS as i64);
}

/// The batch's per-message handler, under the batch's scope.
#[inbox_runtime::idempotent(id = id, handler = "batch.apply", shared_scope)]
async fn apply_handler_async<C>(conn: &mut C, id: &String) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: inbox_runtime::InboxBackend>,
{
    apply_async(conn, id).await
}

/// An async `#[idempotent]` function as the body of an async batch runs for
/// its own message (the batch's claim is not a duplicate to it), once.
pub async fn async_idempotent_handler_is_a_batch_body<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let batch = ids("async-handler", 4);
    let handler = handler();
    for round in 0..2 {
        let report = run_idempotent_batch_async_with(
            &mut conn,
            &handler,
            &batch,
            |id| id,
            MaxAttempts::limit(3),
            async |conn: &mut B::AsyncConnection, id: &String| apply_handler_async(conn, id).await,
        )
        .await;
        match round {
            0 => assert_eq!(report.processed(), 4, "{:?}", report.results()),
            _ => assert_eq!(report.duplicates(), 4, "{:?}", report.results()),
        }
    }
    for id in &batch {
        assert_eq!(effects(&mut observer, id), 1, "{id}");
    }
    // Alone: a batch of one, and a message split off after a failure.
    let batch = ids("async-alone", 3);
    let failed_once = std::sync::atomic::AtomicBool::new(false);
    for sizes in [&batch[..1], &batch[..]] {
        let report = run_idempotent_batch_async_with(
            &mut conn,
            &handler,
            sizes,
            |id| id,
            MaxAttempts::limit(3),
            async |conn: &mut B::AsyncConnection, id: &String| {
                if *id == batch[1] && !failed_once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    return Err(AppError::Failed("once"));
                }
                apply_handler_async(conn, id).await
            },
        )
        .await;
        assert_eq!(report.failed(), 0, "{:?}", report.results());
    }
    for id in &batch {
        assert_eq!(
            effects(&mut observer, id),
            1,
            "{id}: the handler's body ran once"
        );
    }
}

/// One async body for all the new messages: called with the ids just
/// claimed, halved down to a failing message, which alone is counted.
pub async fn async_bulk_bodies_are_halved_down_to_the_culprit<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect_async().await;
    let handler = handler();
    let batch = ids("async-bulk", 6);
    let failing = batch[4].clone();
    let calls = std::sync::atomic::AtomicU32::new(0);
    let report = inbox_runtime::run_idempotent_batch_bulk_async_with(
        &mut conn,
        &handler,
        &batch,
        |id| id,
        MaxAttempts::limit(3),
        async |conn: &mut B::AsyncConnection, ids: &[&String]| {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            for id in ids {
                apply_async(conn, id).await?;
            }
            match ids.contains(&&failing) {
                true => Err(AppError::Failed("boom")),
                false => Ok(()),
            }
        },
    )
    .await;
    for (at, result) in report.results().iter().enumerate() {
        match at {
            4 => assert!(
                matches!(result, Err(AppError::Failed("boom"))),
                "{result:?}"
            ),
            _ => assert!(
                matches!(result, Ok(Outcome::Processed(()))),
                "{at}: {result:?}"
            ),
        }
    }
    assert_eq!(
        failure_row::<B>(&mut observer, &failing),
        counted(1, "the handler failed: boom")
    );
    assert_eq!(all_effects(&mut observer), 5);
    assert!(std::sync::atomic::AtomicU32::load(&calls, std::sync::atomic::Ordering::SeqCst) <= 8);
}

/// A batch's future can be spawned: it is `Send` when the connection, the
/// messages and the body are (checked at compile time).
#[cfg(feature = "postgres")]
#[allow(dead_code)]
fn the_batch_future_is_send(conn: &mut diesel_async::AsyncPgConnection, batch: &[String]) {
    fn send<F: Send>(future: F) -> F {
        future
    }
    let handler = handler();
    drop(send(run_idempotent_batch_async_with(
        conn,
        &handler,
        batch,
        |id| id,
        MaxAttempts::limit(1),
        async |_: &mut diesel_async::AsyncPgConnection, id: &String| Ok::<_, AppError>(id.clone()),
    )));
}

/// PostgreSQL: a deferred foreign key that one message's effect violates,
/// refused at `COMMIT`: the others commit, the culprit's attempt is counted
/// alone (dead at a limit of 1), and the same connection goes on.
pub async fn async_constraint_refused_at_commit_spares_the_others_and_counts_the_culprit<
    B: TestBackend,
>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    inbox_tests::create_deferred_foreign_key::<B>(&mut observer);
    let mut conn = db.connect_async().await;
    let batch = ids("orphan", 6);
    let orphan = batch[3].clone();
    let act = |id: &str| {
        if id == orphan {
            Act::Orphan
        } else {
            Act::Apply
        }
    };
    let (report, runs) = run_async(&mut conn, &batch, MaxAttempts::limit(1), act).await;
    assert_eq!(report.processed(), 5, "{:?}", endings(&report));
    match &report.results()[3] {
        Err(AppError::Inbox(InboxError::AttemptsExhausted { attempts: 1, .. })) => {}
        other => panic!("the orphan's attempt counted, dead: {other:?}"),
    }
    assert_eq!(ack_decision(&report.results()[3]), AckDecision::DeadLetter);
    assert!(runs[&orphan] >= 2, "the orphan ran again alone: {runs:?}");
    assert_eq!(all_effects(&mut observer), 5);
    assert_eq!(effects(&mut observer, &orphan), 0);
    assert_eq!(all_failure_rows(&mut observer), 1, "the orphan, counted");

    let next = ids("after", 3);
    let (again, _) = run_async(&mut conn, &next, MaxAttempts::limit(1), |_| Act::Apply).await;
    assert_eq!(again.processed(), 3, "{:?}", endings(&again));
}

inbox_tests::backend_tests! {
    async only [postgres]:
        async_constraint_refused_at_commit_spares_the_others_and_counts_the_culprit;
    async only [postgres, mysql]:
        async_batches_process_new_ids_and_skip_redeliveries,
        async_failures_are_split_off_and_counted_alone,
        async_panics_are_counted_and_resumed,
        async_killed_connection_aborts_the_batch,
        async_cancellation_at_every_await_point_leaves_nothing_half_done,
        async_racing_batches_apply_each_effect_once,
        async_idempotent_handler_is_a_batch_body,
        async_bulk_bodies_are_halved_down_to_the_culprit;
}
