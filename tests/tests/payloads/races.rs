//! Copies of one id with different payloads delivered at the same moment on
//! separate connections: exactly one body runs, every other copy ends in
//! `Conflict` (or, having lost a lock conflict more often than the runtime
//! retries, in a retryable error whose redelivery is a conflict).

use std::sync::{Arc, Barrier};
use std::time::Duration;

use inbox_runtime::{AckDecision, InboxError, Outcome, ack_decision};
use inbox_tests::{AppError, TestBackend};

use crate::handlers::*;
use crate::support::*;

/// Ids raced per test.
const IDS: usize = 12;
/// How long the winning body holds its claim, so the others wait on it.
const HOLD: Duration = Duration::from_millis(30);
/// The most deliveries one racer makes before the test calls it a livelock.
const MAX_DELIVERIES: u32 = 40;

/// How one racer's copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Processed,
    Conflict,
}

/// Delivers the copy until it ends in a processed body or a conflict:
/// retryable errors are redelivered, as a broker would. `transfer` is one
/// delivery.
fn deliver(
    msg: &Transfer,
    mut transfer: impl FnMut(&Transfer) -> Result<Outcome<()>, AppError>,
) -> Ended {
    for _ in 0..MAX_DELIVERIES {
        let result = transfer(msg);
        match &result {
            Ok(Outcome::Processed(())) => return Ended::Processed,
            Err(AppError::Inbox(InboxError::Conflict(_))) => {
                assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
                return Ended::Conflict;
            }
            // A copy that waited out its claim wait for the winner's body
            // (`InProgress`) is retried later, any other at once.
            Err(error) if error.recovery().is_retryable() => {
                let decision = ack_decision(&result);
                assert!(
                    matches!(decision, AckDecision::Retry | AckDecision::RetryLater),
                    "{}: {decision:?} for {error:?}",
                    msg.id
                );
            }
            other => panic!("{}: unexpected {other:?}", msg.id),
        }
    }
    panic!("{}: not settled after {MAX_DELIVERIES} deliveries", msg.id)
}

pub fn racing_copies_with_different_payloads_run_one_body<B: TestBackend>() {
    race::<B, _, _>(|db: &B| {
        let mut conn = db.connect();
        move |msg: &Transfer| transfer(&mut conn, msg)
    });
}

/// The race with the async handler, each racer on a runtime of its own
/// (on MariaDB a claim reads what the claim it met stored, blocking or
/// async; a blocking connection's first one reads it apart, see
/// `prepared.rs`).
#[cfg(feature = "async")]
pub fn async_racing_copies_with_different_payloads_run_one_body<B: TestBackend>() {
    race::<B, _, _>(|db: &B| {
        let runtime = inbox_tests::runtime::current_thread();
        let mut conn = runtime.block_on(db.connect_async());
        move |msg: &Transfer| {
            runtime.block_on(crate::handlers_async::transfer_async(&mut conn, msg))
        }
    });
}

/// Races copies of each id with different payloads, one racer per thread,
/// each delivering through what `racer` makes for it on its thread.
fn race<B, R, D>(racer: R)
where
    B: TestBackend,
    R: Fn(&B) -> D + Send + Sync + 'static,
    D: FnMut(&Transfer) -> Result<Outcome<()>, AppError>,
{
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let racer_of = Arc::new(racer);
    let db = Arc::new(db);
    let racers = B::RACE_THREADS.clamp(2, 4);
    let barrier = Arc::new(Barrier::new(racers));
    let threads: Vec<_> = (0..racers)
        .map(|racer| {
            let (db, barrier) = (Arc::clone(&db), Arc::clone(&barrier));
            let racer_of = Arc::clone(&racer_of);
            std::thread::spawn(move || {
                let mut transfer = racer_of(&db);
                (0..IDS)
                    .map(|n| {
                        let msg = Transfer::new(&format!("race-{n}"), &format!("racer-{racer}"))
                            .holding(HOLD);
                        barrier.wait();
                        // A copy that fails the test must not leave the
                        // other racers waiting at the barrier for it: its
                        // panic is raised once every racer is done.
                        let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            deliver(&msg, &mut transfer)
                        }));
                        (ended, msg.runs())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let ends: Vec<Vec<(Ended, u32)>> = threads
        .into_iter()
        .map(|thread| thread.join().expect("a racer panicked"))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|racer| {
            racer
                .into_iter()
                .map(|(ended, runs)| (ended.unwrap_or_else(|p| std::panic::resume_unwind(p)), runs))
                .collect()
        })
        .collect();
    let (mut processed, mut conflicts) = (0, 0);
    for n in 0..IDS {
        let per_id: Vec<Ended> = ends.iter().map(|racer| racer[n].0).collect();
        for racer in &ends {
            if racer[n].0 == Ended::Conflict {
                assert_eq!(racer[n].1, 0, "race-{n}: a conflicting copy runs no body");
            }
        }
        let winners = per_id.iter().filter(|e| **e == Ended::Processed).count();
        assert_eq!(
            winners, 1,
            "race-{n}: exactly one body committed: {per_id:?}"
        );
        processed += winners;
        conflicts += per_id.len() - winners;
        let bodies = applied(&mut observer, &format!("race-{n}"));
        assert_eq!(bodies.len(), 1, "race-{n}: one effect: {bodies:?}");
        let winner = per_id.iter().position(|e| *e == Ended::Processed).unwrap();
        assert_eq!(
            bodies[0],
            format!("racer-{winner}"),
            "race-{n}: the winner's payload"
        );
    }
    assert_eq!(processed, IDS);
    assert_eq!(conflicts, IDS * (racers - 1));
    assert_eq!(all_effects(&mut observer), IDS as i64);
    println!(
        "{}: {IDS} ids, {racers} racers with different payloads: {processed} processed, \
         {conflicts} conflicts",
        B::NAME
    );
}

inbox_tests::backend_tests!(racing_copies_with_different_payloads_run_one_body);
#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    inbox_tests::backend_tests!(async_racing_copies_with_different_payloads_run_one_body);
}
