//! Concurrent deliveries of the same ids on separate connections.

use inbox_runtime::Outcome;

use crate::handlers::*;
use crate::support::*;

/// How many ids a race delivers.
const RACE_IDS: usize = 500;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, mpsc};
use std::time::{Duration, Instant};

/// The shape of one race.
#[derive(Clone, Copy)]
struct RacePlan {
    name: &'static str,
    threads: usize,
    ids: usize,
    /// `None`: each thread shuffles all ids. `Some(w)`: each thread
    /// shuffles within consecutive windows of `w` ids, so the threads
    /// move through the ids nearly in step and collide constantly.
    window: Option<usize>,
    /// When non-zero, about one processing attempt in this many fails
    /// (after writing its effect), rolling its claim back while other
    /// deliveries of the id may be waiting on it.
    fail_one_in: u64,
}

/// What the deliveries of a race ended with.
#[derive(Default)]
struct Tally {
    processed: usize,
    duplicates: usize,
    /// Duplicates that started while the processing transaction of
    /// the same id was in flight: deliveries that really collided.
    overlapping: usize,
    /// The deliberate failures of `fail_one_in`.
    body_failures: usize,
    /// Deadlocks reported by the database (retryable).
    deadlocks: Vec<String>,
    /// Anything else: always a test failure.
    other_errors: Vec<String>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.processed += other.processed;
        self.duplicates += other.duplicates;
        self.overlapping += other.overlapping;
        self.body_failures += other.body_failures;
        self.deadlocks.extend(other.deadlocks);
        self.other_errors.extend(other.other_errors);
    }

    fn deliveries(&self) -> usize {
        self.processed
            + self.duplicates
            + self.body_failures
            + self.deadlocks.len()
            + self.other_errors.len()
    }
}

fn is_deadlock(error: &AppError) -> bool {
    matches!(
        error,
        AppError::Db(diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::SerializationFailure,
            info,
        )) if info.message().contains("Deadlock")
    )
}

/// Whether `worker`'s delivery of id number `i` fails (deterministic).
fn fails(plan: RacePlan, worker: usize, i: usize) -> bool {
    let mut rng = XorShift::new(((worker as u64) << 32) | i as u64);
    plan.fail_one_in > 0 && rng.next_u64() % plan.fail_one_in == 0
}

/// One race thread: its own connection, its own order of the ids.
fn race_worker<B: E2e>(
    db: &B,
    plan: RacePlan,
    worker: usize,
    ids: &[String],
    in_flight: &[AtomicBool],
    barrier: &Barrier,
) -> Tally {
    let mut conn = db.connect();
    let mut rng = XorShift::new(worker as u64 + 1);
    let mut order: Vec<usize> = (0..ids.len()).collect();
    match plan.window {
        None => rng.shuffle(&mut order),
        Some(window) => order.chunks_mut(window).for_each(|c| rng.shuffle(c)),
    }
    let mut tally = Tally::default();
    barrier.wait();
    for i in order {
        let overlapping = in_flight[i].load(Ordering::SeqCst);
        let delivery = RaceDelivery {
            id: &ids[i],
            worker: worker as i32,
            in_flight: &in_flight[i],
            fail: fails(plan, worker, i),
        };
        let result = race(&mut conn, &delivery);
        if !matches!(result, Ok(Outcome::Duplicate)) {
            // This delivery ran the body or failed: its transaction is over.
            in_flight[i].store(false, Ordering::SeqCst);
        }
        match result {
            Ok(Outcome::Processed(())) => tally.processed += 1,
            Ok(Outcome::Duplicate) => {
                tally.duplicates += 1;
                tally.overlapping += usize::from(overlapping);
            }
            Err(AppError::Failed(_)) if delivery.fail => tally.body_failures += 1,
            Err(error) if is_deadlock(&error) => {
                tally.deadlocks.push(format!("{}: {error:?}", ids[i]));
            }
            Err(error) => tally.other_errors.push(format!("{}: {error:?}", ids[i])),
        }
    }
    tally
}

/// Runs `plan`: every thread, with its own connection and its own
/// order, delivers every id once; all start together on a barrier.
fn run_race<B: E2e>(db: &B, plan: RacePlan) -> (Tally, Duration) {
    let ids: Vec<String> = (0..plan.ids).map(|i| format!("race-{i:04}")).collect();
    let in_flight: Vec<AtomicBool> = ids.iter().map(|_| AtomicBool::new(false)).collect();
    let barrier = Barrier::new(plan.threads + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..plan.threads)
            .map(|worker| {
                let (ids, in_flight, barrier) = (&ids, &in_flight, &barrier);
                scope.spawn(move || race_worker(db, plan, worker, ids, in_flight, barrier))
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut total = Tally::default();
        for worker in workers {
            total.add(worker.join().expect("a race worker panicked"));
        }
        (total, start.elapsed())
    })
}

/// The start of a race's printed line: the backend, the plan and the
/// deliveries' outcomes.
fn race_summary(backend: &str, plan: &RacePlan, tally: &Tally) -> String {
    format!(
        "race {backend} ({}): threads={} ids={} deliveries={} processed={} duplicates={}",
        plan.name,
        plan.threads,
        plan.ids,
        tally.deliveries(),
        tally.processed,
        tally.duplicates,
    )
}

/// Effects per message id.
fn effects_per_id<C: Effects>(conn: &mut C) -> HashMap<String, usize> {
    let mut per_id = HashMap::new();
    for (_, id, _) in conn.all_effects() {
        *per_id.entry(id).or_default() += 1;
    }
    per_id
}

/// Runs a race without failures and checks: no error, one processed
/// delivery and one effect per id, every id once in the inbox.
fn race_without_failures<B: E2e>(window: Option<usize>, name: &'static str) {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let plan = RacePlan {
        name,
        threads: B::RACE_THREADS,
        ids: RACE_IDS,
        window,
        fail_one_in: 0,
    };
    let (tally, elapsed) = run_race(&db, plan);
    let effects_total: i64 = conn.effects_total();
    let per_id = effects_per_id(&mut conn);
    let inbox = conn.inbox_rows();
    println!(
        "{} effects={effects_total} distinct_effect_ids={} inbox_rows={} \
         overlapping_duplicates={} errors={} elapsed={elapsed:.2?}",
        race_summary(B::NAME, &plan, &tally),
        per_id.len(),
        inbox.len(),
        tally.overlapping,
        tally.deadlocks.len() + tally.other_errors.len(),
    );

    assert!(
        tally.deadlocks.is_empty(),
        "deadlocks: {:#?}",
        tally.deadlocks
    );
    assert!(
        tally.other_errors.is_empty(),
        "errors: {:#?}",
        tally.other_errors
    );
    assert_eq!(
        tally.processed, plan.ids,
        "each id processed by exactly one delivery"
    );
    assert_eq!(
        tally.processed + tally.duplicates,
        plan.threads * plan.ids,
        "every delivery is processed or a duplicate"
    );
    assert_eq!(effects_total, plan.ids as i64, "one effect per id");
    assert_eq!(per_id.len(), plan.ids);
    let doubled: Vec<_> = per_id.iter().filter(|(_, n)| **n != 1).collect();
    assert!(doubled.is_empty(), "ids with a double effect: {doubled:?}");
    let expected: Vec<(String, String)> = (0..plan.ids)
        .map(|i| ("e2e.race".to_owned(), format!("race-{i:04}")))
        .collect();
    assert_eq!(inbox, expected, "every id exactly once in the inbox");
}

/// The required race: each thread delivers all ids in its own
/// fully shuffled order.
pub fn race_shuffled_orders<B: E2e>() {
    race_without_failures::<B>(None, "shuffled");
}

/// The same, with the threads moving through the ids nearly in step
/// (shuffled within windows of 4), so most deliveries collide.
pub fn race_lockstep_orders<B: E2e>() {
    race_without_failures::<B>(Some(4), "lockstep");
}

/// Lockstep race in which about a third of the processing attempts
/// fail and roll back while other deliveries of the id wait; then
/// every id is redelivered once more, as a broker would.
pub fn race_with_rollbacks<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let plan = RacePlan {
        name: "lockstep with rollbacks",
        threads: B::RACE_THREADS,
        ids: RACE_IDS / 2,
        window: Some(4),
        fail_one_in: 3,
    };
    let (tally, elapsed) = run_race(&db, plan);
    let after_race = effects_per_id(&mut conn);
    // Redeliver everything once: the ids whose every delivery failed
    // are processed now, the others are duplicates.
    let mut late = 0;
    let never_in_flight = AtomicBool::new(false);
    for i in 0..plan.ids {
        let id = format!("race-{i:04}");
        let delivery = RaceDelivery {
            id: &id,
            worker: -1,
            in_flight: &never_in_flight,
            fail: false,
        };
        if race(&mut conn, &delivery)
            .expect("the final redelivery")
            .is_processed()
        {
            late += 1;
        }
    }
    let per_id = effects_per_id(&mut conn);
    println!(
        "{} body_failures={} deadlocks={} other_errors={} \
         processed_by_final_redelivery={late} effects={} elapsed={elapsed:.2?}",
        race_summary(B::NAME, &plan, &tally),
        tally.body_failures,
        tally.deadlocks.len(),
        tally.other_errors.len(),
        per_id.values().sum::<usize>(),
    );
    if let Some(first) = tally.deadlocks.first() {
        println!("race {}: first deadlock: {first}", B::NAME);
    }

    assert!(
        tally.other_errors.is_empty(),
        "errors: {:#?}",
        tally.other_errors
    );
    assert!(
        B::ROLLBACK_STORMS_MAY_OUTLAST_CLAIM_RETRIES || tally.deadlocks.is_empty(),
        "deadlocks: {:#?}",
        tally.deadlocks
    );
    assert!(tally.body_failures > 0, "the plan makes some bodies fail");
    assert_eq!(tally.deliveries(), plan.threads * plan.ids);
    assert!(
        after_race.values().all(|n| *n == 1),
        "no double effect during the race"
    );
    assert_eq!(
        tally.processed,
        after_race.len(),
        "one effect per processed delivery"
    );
    assert_eq!(
        tally.processed + late,
        plan.ids,
        "every id processed exactly once"
    );
    assert_eq!(per_id.len(), plan.ids);
    assert!(per_id.values().all(|n| *n == 1), "no double effect");
    assert_eq!(conn.inbox_rows().len(), plan.ids);
}

/// How a contended delivery ended.
#[derive(Debug)]
enum Ended {
    Processed,
    Duplicate,
    /// Read only through `Debug`, in assertion messages.
    Failed(#[allow(dead_code)] AppError),
}

/// Holds the claim of `id` in an open transaction (a gated delivery),
/// starts `waiters` deliveries of the same id on their own
/// connections, checks they wait, then lets the gated delivery commit
/// or fail. Returns the gated result and how each waiter ended.
fn contend<B: E2e>(
    db: &B,
    id: &str,
    waiters: usize,
    commit: bool,
) -> (Result<(), AppError>, Vec<Ended>) {
    let ready = Barrier::new(waiters + 1);
    std::thread::scope(|scope| {
        let (claimed_tx, claimed_rx) = mpsc::channel();
        let (verdict_tx, verdict_rx) = mpsc::channel();
        let gated_delivery = scope.spawn(move || {
            let mut conn = db.connect();
            let msg = Gated {
                id: id.to_owned(),
                claimed: claimed_tx,
                outcome: verdict_rx,
            };
            gated(&mut conn, &msg)
        });
        claimed_rx
            .recv()
            .expect("the gated delivery claimed the id");
        let waiting: Vec<_> = (0..waiters)
            .map(|_| {
                let ready = &ready;
                scope.spawn(move || {
                    let mut conn = db.connect();
                    ready.wait();
                    let msg = Msg::new(id);
                    match apply(&mut conn, &msg) {
                        Ok(()) if msg.runs.get() == 1 => Ended::Processed,
                        Ok(()) => Ended::Duplicate,
                        Err(error) => Ended::Failed(error),
                    }
                })
            })
            .collect();
        ready.wait();
        // Give the waiters time to reach their claim and block on it.
        std::thread::sleep(Duration::from_millis(300));
        for waiter in &waiting {
            assert!(
                !waiter.is_finished(),
                "a delivery finished while the same id's claim was uncommitted"
            );
        }
        verdict_tx.send(commit).expect("the gated delivery waits");
        let gated_result = gated_delivery.join().expect("the gated delivery panicked");
        let ended = waiting
            .into_iter()
            .map(|waiter| waiter.join().expect("a waiter panicked"))
            .collect();
        (gated_result, ended)
    })
}

pub fn waiting_delivery_is_a_duplicate_once_the_first_commits<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let (gated_result, ended) = contend(&db, "w-1", 1, true);
    gated_result.expect("the gated delivery commits");
    assert!(matches!(ended[..], [Ended::Duplicate]), "{ended:?}");
    assert_eq!(
        conn.all_effects(),
        vec![(APPLY.to_owned(), "w-1".to_owned(), "gated".to_owned())]
    );
    assert_eq!(conn.inbox_count(APPLY, "w-1"), 1);
}

pub fn waiting_delivery_processes_once_the_first_rolls_back<B: E2e>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let (gated_result, ended) = contend(&db, "w-2", 1, false);
    assert!(
        matches!(gated_result, Err(AppError::Failed(_))),
        "{gated_result:?}"
    );
    assert!(matches!(ended[..], [Ended::Processed]), "{ended:?}");
    assert_eq!(
        conn.all_effects(),
        vec![(APPLY.to_owned(), "w-2".to_owned(), "apply".to_owned())]
    );
    assert_eq!(conn.inbox_count(APPLY, "w-2"), 1);
}

/// Several deliveries wait on a claim that then rolls back. The
/// contract: one processes, the others see a duplicate, none fails.
/// (On MariaDB/MySQL the waiters deadlock on the key's gap lock; the
/// runtime retries the victims' claims, which then see a duplicate.)
fn waiters_after_a_rollback<B: E2e>(waiters: usize) {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let (gated_result, ended) = contend(&db, "w-3", waiters, false);
    println!(
        "contention {}: first delivery rolled back, {waiters} waiters ended {ended:?}",
        B::NAME
    );
    assert!(
        matches!(gated_result, Err(AppError::Failed(_))),
        "{gated_result:?}"
    );
    assert_eq!(
        conn.effects_for("w-3"),
        1,
        "the effect applied once: {ended:?}"
    );
    assert_eq!(conn.inbox_count(APPLY, "w-3"), 1);
    let processed = ended
        .iter()
        .filter(|e| matches!(e, Ended::Processed))
        .count();
    assert_eq!(processed, 1, "exactly one waiter processes: {ended:?}");
    let duplicates = ended
        .iter()
        .filter(|e| matches!(e, Ended::Duplicate))
        .count();
    assert_eq!(duplicates, waiters - 1, "no delivery may fail: {ended:?}");
    assert_connection_usable(&mut conn);
}

pub fn two_waiting_deliveries_after_a_rollback<B: E2e>() {
    waiters_after_a_rollback::<B>(2);
}

pub fn four_waiting_deliveries_after_a_rollback<B: E2e>() {
    waiters_after_a_rollback::<B>(4);
}

inbox_tests::backend_tests!(
    race_shuffled_orders,
    race_lockstep_orders,
    race_with_rollbacks,
    waiting_delivery_is_a_duplicate_once_the_first_commits,
    waiting_delivery_processes_once_the_first_rolls_back,
    two_waiting_deliveries_after_a_rollback,
    four_waiting_deliveries_after_a_rollback,
);
