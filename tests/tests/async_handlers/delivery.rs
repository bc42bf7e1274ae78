//! What an async handler does with a delivery: processed then duplicate,
//! an error or a panic rolls back, nesting in the caller's transaction, two
//! handlers of one message, bad ids, pooled connections, and cancellation at
//! every await point.

use diesel_async::AsyncConnection;
use futures_util::FutureExt;
use inbox_runtime::background::AsyncPool;
use inbox_runtime::{InboxError, Outcome};
use inbox_tests::{AppError, ServerBackend, TestBackend};

use crate::handlers::*;
use crate::support::*;

pub async fn processed_then_duplicate<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let msg = Msg::new("m-1").by(7);
    assert_eq!(
        record(&mut conn, &msg).await.unwrap(),
        Outcome::Processed(7)
    );
    assert_eq!(record(&mut conn, &msg).await.unwrap(), Outcome::Duplicate);
    assert_eq!(effects(&mut conn, "m-1").await, 1);
    assert_eq!(claims(&mut conn, "async.record", "m-1").await, 1);
}

pub async fn an_error_rolls_back_the_claim_and_a_retry_processes<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let failing = Msg::new("m-err").failing();
    match record(&mut conn, &failing).await {
        Err(AppError::Failed(why)) => assert_eq!(why, "the body failed"),
        other => panic!("expected the body's own error, got {other:?}"),
    }
    assert_eq!(effects(&mut conn, "m-err").await, 0);
    assert_eq!(claims(&mut conn, "async.record", "m-err").await, 0);
    let retry = Msg::new("m-err");
    assert_eq!(
        record(&mut conn, &retry).await.unwrap(),
        Outcome::Processed(0)
    );
    assert_eq!(record(&mut conn, &retry).await.unwrap(), Outcome::Duplicate);
    assert_eq!(effects(&mut conn, "m-err").await, 1);
}

pub async fn a_panic_rolls_back_the_claim_and_a_retry_processes<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let panicking = Msg::new("m-panic").panicking();
    let caught = std::panic::AssertUnwindSafe(record(&mut conn, &panicking))
        .catch_unwind()
        .await;
    assert!(caught.is_err(), "the panic is resumed after the rollback");
    assert_eq!(effects(&mut conn, "m-panic").await, 0);
    assert_eq!(claims(&mut conn, "async.record", "m-panic").await, 0);
    let retry = Msg::new("m-panic");
    assert_eq!(
        record(&mut conn, &retry).await.unwrap(),
        Outcome::Processed(0)
    );
    assert_eq!(effects(&mut conn, "m-panic").await, 1);
}

pub async fn nested_in_an_outer_transaction_the_claim_follows_the_outer_outcome<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let msg = Msg::new("m-nested");
    let rolled_back = conn
        .transaction(async |conn| {
            assert_eq!(record(conn, &msg).await?, Outcome::Processed(0));
            Err::<(), AppError>(AppError::Db(diesel::result::Error::RollbackTransaction))
        })
        .await;
    assert!(rolled_back.is_err());
    assert_eq!(effects(&mut conn, "m-nested").await, 0);
    assert_eq!(claims(&mut conn, "async.record", "m-nested").await, 0);

    conn.transaction(async |conn| {
        assert_eq!(record(conn, &msg).await?, Outcome::Processed(0));
        Ok::<(), AppError>(())
    })
    .await
    .unwrap();
    assert_eq!(record(&mut conn, &msg).await.unwrap(), Outcome::Duplicate);
    assert_eq!(effects(&mut conn, "m-nested").await, 1);
}

pub async fn two_handlers_each_process_the_same_message_once<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let msg = Msg::new("fan-out").by(3);
    assert_eq!(
        record(&mut conn, &msg).await.unwrap(),
        Outcome::Processed(3)
    );
    audit(&mut conn, &msg).await.unwrap();
    assert_eq!(record(&mut conn, &msg).await.unwrap(), Outcome::Duplicate);
    audit(&mut conn, &msg).await.unwrap();
    assert_eq!(effects(&mut conn, "fan-out").await, 2);
    assert_eq!(claims(&mut conn, "async.record", "fan-out").await, 1);
    assert_eq!(claims(&mut conn, "async.audit", "fan-out").await, 1);
}

pub async fn bad_ids_are_typed_errors_that_record_nothing<B: TestBackend>() {
    let Some((_db, mut conn)) = fresh::<B>().await else {
        return;
    };
    for bad in [String::new(), "x".repeat(256), "a\0b".to_owned()] {
        let msg = Msg::new(bad.clone());
        match record(&mut conn, &msg).await {
            Err(AppError::Inbox(error @ InboxError::InvalidMessageId { .. })) => {
                assert!(!error.is_retryable())
            }
            other => panic!("expected an invalid id error for {bad:?}, got {other:?}"),
        }
        let via_diesel = audit(&mut conn, &msg).await.unwrap_err();
        assert!(InboxError::find_in(&via_diesel).is_some_and(InboxError::is_invalid_message));
    }
    let total: i64 = all_effects(&mut conn).await;
    let claimed: i64 = all_claims(&mut conn).await;
    assert_eq!((total, claimed), (0, 0));
}

pub async fn deadpool_and_bb8_connections_work_as_handler_connections<B: ServerBackend>() {
    let Some((db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let deadpool = B::deadpool(db.url(), 2);
    let bb8 = B::bb8(db.url(), 2).await;
    let msg = Msg::new("pooled");
    let mut object = deadpool.checkout().await.unwrap();
    assert_eq!(
        record_deadpool(&mut object, &msg).await.unwrap(),
        Outcome::Processed(())
    );
    assert_eq!(
        record_deadpool(&mut object, &msg).await.unwrap(),
        Outcome::Duplicate
    );
    record_bb8(bb8.checkout().await.unwrap(), &msg)
        .await
        .unwrap();
    record_bb8(bb8.checkout().await.unwrap(), &Msg::new("pooled-2"))
        .await
        .unwrap();
    assert_eq!(effects(&mut conn, "pooled").await, 1);
    assert_eq!(effects(&mut conn, "pooled-2").await, 1);
}

/// Drops the handler's future after each number of waits in turn, until
/// it completes: every cancelled attempt must leave claim and effect
/// together (both or neither), a directly held connection must refuse
/// further transactions, and pooled connections must come back usable.
pub async fn cancellation_at_every_await_point_leaves_nothing_half_done<B: ServerBackend>() {
    let Some((db, mut observer)) = fresh::<B>().await else {
        return;
    };
    let pool = B::deadpool(db.url(), 1);
    let mut cancelled_points = 0;
    for polls in 0.. {
        assert!(polls < 100, "the handler never completed");
        let id = format!("cancel-{polls}");
        let msg = Msg::new(id.clone());

        // A connection held directly.
        let mut direct = db.connect_async().await;
        let attempt = CancelAfter::new(record(&mut direct, &msg), polls).await;
        let finished = attempt.is_some();
        if finished {
            assert_eq!(attempt.unwrap().unwrap(), Outcome::Processed(0));
        } else {
            cancelled_points += 1;
            match record(&mut direct, &Msg::new("after-cancel")).await {
                Err(AppError::Db(diesel::result::Error::BrokenTransactionManager)) => {}
                other => panic!("a cancelled connection must refuse new work, got {other:?}"),
            }
        }
        drop(direct);
        let (direct_effects, direct_claims) =
            effects_and_claims(&mut observer, "async.record", &id).await;
        assert_eq!(
            direct_effects, direct_claims,
            "claim and effect commit together (after {polls} waits)"
        );

        // A pooled connection (pool of one, so the next checkout is it).
        let pooled_id = format!("cancel-pooled-{polls}");
        let pooled_msg = Msg::new(pooled_id.clone());
        {
            let mut object = pool.checkout().await.unwrap();
            let _ = CancelAfter::new(record_deadpool(&mut object, &pooled_msg), polls).await;
        }
        let mut object = pool
            .checkout()
            .await
            .expect("the pool hands out a usable connection");
        let redelivered = record_deadpool(&mut object, &pooled_msg)
            .await
            .expect("the redelivery works");
        let (effect, claim) = (
            effects(&mut observer, &pooled_id).await,
            claims(&mut observer, "async.record", &pooled_id).await,
        );
        assert_eq!(
            (effect, claim),
            (1, 1),
            "exactly once after a cancellation ({redelivered:?})"
        );

        // The redelivery of the directly held message processes it once. A
        // COMMIT sent before the drop can still land after the read above
        // (the server finishes it without its client): the redelivery's
        // claim then waits for it and finds a duplicate.
        let mut fresh_conn = db.connect_async().await;
        let redelivered = record(&mut fresh_conn, &msg).await.unwrap();
        if direct_effects == 1 {
            assert_eq!(redelivered, Outcome::Duplicate);
        } else {
            assert!(
                matches!(redelivered, Outcome::Processed(0) | Outcome::Duplicate),
                "{redelivered:?}"
            );
        }
        assert_eq!(effects(&mut observer, &id).await, 1);
        if finished {
            break;
        }
    }
    assert!(
        cancelled_points >= 3,
        "only {cancelled_points} await points were exercised"
    );
    println!(
        "async cancellation {}: cancelled at {cancelled_points} await points",
        B::NAME
    );
}

inbox_tests::backend_tests!(async only [postgres, mysql]:
    processed_then_duplicate,
    an_error_rolls_back_the_claim_and_a_retry_processes,
    a_panic_rolls_back_the_claim_and_a_retry_processes,
    nested_in_an_outer_transaction_the_claim_follows_the_outer_outcome,
    two_handlers_each_process_the_same_message_once,
    bad_ids_are_typed_errors_that_record_nothing,
    deadpool_and_bb8_connections_work_as_handler_connections,
    cancellation_at_every_await_point_leaves_nothing_half_done,
);
