//! Copies of a message whose first delivery is still in flight, on
//! diesel-async: the same bounded claim as the blocking runner (one core),
//! answered `InProgress` within the bound while other ids flow.

use std::time::{Duration, Instant};

use inbox_runtime::{AckDecision, ClaimKey, ClaimWait, HandlerName, InboxError, Options, Outcome};
use inbox_tests::{AppError, ServerBackend};

use crate::handlers::write_effect;
use crate::support::*;

const HANDLER: &str = "async.in_flight";
/// How long the first delivery's body holds its claim.
const HOLD: Duration = Duration::from_secs(3);
/// The copies' bound (MariaDB counts whole seconds).
const BOUND: Duration = Duration::from_secs(1);
/// What a copy may take beyond its bound.
const SLACK: Duration = Duration::from_millis(250);
const COPIES: usize = 50;
const WORKERS: usize = 8;

fn key(id: &str) -> ClaimKey {
    ClaimKey::new(HandlerName::new(HANDLER).expect("a valid name"), id).expect("a valid id")
}

async fn deliver<C>(conn: &mut C, id: &str) -> Result<Outcome<()>, AppError>
where
    C: diesel_async::AsyncConnection<Backend: inbox_runtime::InboxBackend>,
{
    let options = Options::new().claim_wait(ClaimWait::Bounded(BOUND));
    inbox_runtime::run_idempotent_async_with(conn, key(id), options, async |conn: &mut C| {
        write_effect(conn, id, 0).await?;
        Ok(Outcome::Processed(()))
    })
    .await
}

/// 50 copies, 8 tasks on their own connections, while the first delivery
/// holds its claim for 3 s: one body run, every copy answered within the
/// bound (in progress, then duplicates), other ids never held up.
pub async fn copies_of_a_slow_delivery_are_in_progress_within_the_bound<B: ServerBackend>() {
    let Some((db, mut observer)) = fresh::<B>().await else {
        return;
    };
    let slow = "slow-async";
    // Connected before the first delivery's hold starts: the hold has to
    // cover every task's first copy, not the connecting too (on a loaded
    // machine, eight connections took long enough for one task's first
    // copy to come after the hold ended).
    let mut conns = Vec::new();
    for _ in 0..WORKERS {
        conns.push(db.connect_async().await);
    }
    let mut holder = db.connect_async().await;
    let (taken, claim_taken) = tokio::sync::oneshot::channel();
    let first = tokio::spawn(async move {
        let key = key(slow);
        let mut claimed = inbox_runtime::begin_claimed(&mut holder, &key)
            .await
            .expect("claim")
            .expect("a new id");
        let effect = write_effect(claimed.conn(), slow, 0).await;
        taken.send(()).expect("the test listens");
        tokio::time::sleep(HOLD).await;
        claimed.finish(effect).await
    });
    claim_taken.await.expect("the first delivery claims its id");
    let mut tasks = Vec::new();
    for (worker, mut conn) in conns.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut copies = Vec::new();
            let mut others = Vec::new();
            for (round, _) in (worker..COPIES).step_by(WORKERS).enumerate() {
                let other = format!("other-{worker}-{round}");
                let began = Instant::now();
                let result = deliver(&mut conn, &other).await;
                others.push((began.elapsed(), result));
                let began = Instant::now();
                let result = deliver(&mut conn, slow).await;
                copies.push((began.elapsed(), result));
            }
            (copies, others)
        }));
    }
    let mut copies = Vec::new();
    let mut others = Vec::new();
    for task in tasks {
        let (task_copies, task_others) = task.await.expect("no panic");
        copies.extend(task_copies);
        others.extend(task_others);
    }
    first
        .await
        .expect("no panic")
        .expect("the first delivery commits");

    let in_progress = copies
        .iter()
        .filter(|(_, result)| matches!(result, Err(AppError::Inbox(InboxError::InProgress { .. }))))
        .count();
    let duplicates = copies
        .iter()
        .filter(|(_, result)| matches!(result, Ok(Outcome::Duplicate)))
        .count();
    let slowest = copies
        .iter()
        .map(|(took, _)| *took)
        .max()
        .unwrap_or_default();
    println!(
        "{} (async): {COPIES} copies, first delivery held {HOLD:?}, bound {BOUND:?}: \
         {in_progress} in progress, {duplicates} duplicates, slowest answer {slowest:?}",
        B::NAME
    );
    assert_eq!(in_progress + duplicates, COPIES, "{copies:?}");
    assert!(
        in_progress >= WORKERS,
        "each task's first copy meets the first delivery"
    );
    assert!(slowest <= BOUND + SLACK, "a copy waited {slowest:?}");
    for (_, result) in &copies {
        if result.is_err() {
            assert_eq!(inbox_runtime::ack_decision(result), AckDecision::RetryLater);
        }
    }
    assert_eq!(effects(&mut observer, slow).await, 1, "the body ran once");
    let slowest_other = others
        .iter()
        .map(|(took, result)| {
            assert!(matches!(result, Ok(Outcome::Processed(()))), "{result:?}");
            *took
        })
        .max()
        .unwrap_or_default();
    println!(
        "{} (async): the other ids meanwhile: slowest {slowest_other:?}",
        B::NAME
    );
    assert!(slowest_other < BOUND, "another id waited {slowest_other:?}");
    let mut conn = db.connect_async().await;
    assert_eq!(
        deliver(&mut conn, slow).await.expect("a duplicate"),
        Outcome::Duplicate
    );
}

inbox_tests::backend_tests!(async (multi_thread = 2) only [postgres, mysql]:
    copies_of_a_slow_delivery_are_in_progress_within_the_bound,
);
