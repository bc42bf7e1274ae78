//! Deliveries waiting on a claim that then rolls back.

use inbox_runtime::Outcome;
use inbox_tests::{AppError, ServerBackend};

use crate::handlers::*;
use crate::support::*;

/// Two deliveries wait on a claim that then rolls back. On
/// MariaDB/MySQL the waiters deadlock on the key's gap lock and
/// InnoDB rolls one back (error 1213, which diesel-async does not
/// map): the runtime must retry that claim, not hand the deadlock to
/// the caller.
pub async fn waiters_on_a_claim_that_rolls_back_both_complete<B: ServerBackend>() {
    let Some((db, mut observer)) = fresh::<B>().await else {
        return;
    };
    for round in 0..3 {
        let id = format!("waiters-{round}");
        let key = inbox_runtime::ClaimKey::new(
            inbox_runtime::HandlerName::new("async.record").unwrap(),
            &id,
        )
        .unwrap();
        let mut holder = db.connect_async().await;
        let claimed = inbox_runtime::begin_claimed(&mut holder, &key)
            .await
            .expect("claim")
            .expect("a new id");
        let mut waiters = Vec::new();
        let mut ids = Vec::new();
        for worker in 1..=2 {
            let mut conn = db.connect_async().await;
            ids.push(inbox_tests::connection_id_async::<B>(&mut conn).await);
            let msg = Msg::new(id.clone()).by(worker);
            waiters.push(tokio::spawn(async move { record(&mut conn, &msg).await }));
        }
        wait_for_lock_waiters::<B>(&mut observer, &ids, 2).await;
        claimed
            .finish(Err::<(), AppError>(AppError::Failed("the holder fails")))
            .await
            .expect_err("rolled back");
        let mut outcomes = Vec::new();
        for waiter in waiters {
            outcomes.push(
                waiter
                    .await
                    .expect("no panic")
                    .expect("no deadlock reaches the caller"),
            );
        }
        outcomes.sort_by_key(|outcome| matches!(outcome, Outcome::Duplicate));
        assert!(matches!(outcomes[0], Outcome::Processed(_)), "{outcomes:?}");
        assert_eq!(outcomes[1], Outcome::Duplicate, "round {round}");
        assert_eq!(effects(&mut observer, &id).await, 1);
    }
}

inbox_tests::backend_tests!(async (multi_thread = 2) only [postgres, mysql]:
    waiters_on_a_claim_that_rolls_back_both_complete,
);
