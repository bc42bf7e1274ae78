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
/// retryable errors are redelivered, as a broker would.
fn deliver<B: TestBackend>(conn: &mut B::Connection, msg: &Transfer) -> Ended {
    for _ in 0..MAX_DELIVERIES {
        let result = transfer(conn, msg);
        match &result {
            Ok(Outcome::Processed(())) => return Ended::Processed,
            Err(AppError::Inbox(InboxError::Conflict(_))) => {
                assert_eq!(ack_decision(&result), AckDecision::DeadLetter);
                return Ended::Conflict;
            }
            Err(error) if error.recovery().is_retryable() => {
                assert_eq!(ack_decision(&result), AckDecision::Retry);
            }
            other => panic!("{}: unexpected {other:?}", msg.id),
        }
    }
    panic!("{}: not settled after {MAX_DELIVERIES} deliveries", msg.id)
}

pub fn racing_copies_with_different_payloads_run_one_body<B: TestBackend>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let db = Arc::new(db);
    let racers = B::RACE_THREADS.clamp(2, 4);
    let barrier = Arc::new(Barrier::new(racers));
    let threads: Vec<_> = (0..racers)
        .map(|racer| {
            let (db, barrier) = (Arc::clone(&db), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut conn = db.connect();
                (0..IDS)
                    .map(|n| {
                        let msg = Transfer::new(&format!("race-{n}"), &format!("racer-{racer}"))
                            .holding(HOLD);
                        barrier.wait();
                        (deliver::<B>(&mut conn, &msg), msg.runs())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let ends: Vec<Vec<(Ended, u32)>> = threads
        .into_iter()
        .map(|thread| thread.join().expect("a racer panicked"))
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
