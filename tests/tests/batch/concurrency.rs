//! Batches racing each other: threads, each on its own connection, deliver
//! overlapping, shuffled batches of the same ids, redelivering every
//! message whose result says `Retry` (as a broker would), alongside threads
//! delivering the same ids one by one with `run_idempotent`. Each id's
//! effect (a counter increment in the same transaction) must be applied
//! exactly once, by exactly one delivery, and every message must end
//! acknowledged.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use diesel::Connection;
use diesel::connection::LoadConnection;
use diesel::connection::SimpleConnection;
use inbox_runtime::{
    AckDecision, ClaimKey, InboxBackend, MaxAttempts, Outcome, Recovery, ack_decision,
    run_idempotent,
};
use inbox_tests::{SqlRows, TestBackend};

use crate::support::*;

/// The ids every thread delivers in a round (each round has new ids).
const IDS: usize = 200;
/// Threads delivering batches.
const BATCH_THREADS: usize = 8;
/// Threads delivering one message at a time.
const SINGLE_THREADS: usize = 2;
/// Races, one after the other, each over ids of its own, all threads
/// starting together.
const ROUNDS: usize = 4;
/// The most deliveries (batches or messages) one thread makes in a round
/// before the test calls it a livelock.
const MAX_DELIVERIES: usize = 2_000;
/// How long one thread may take for all its rounds.
const HANG: Duration = Duration::from_secs(120);

/// What one thread saw.
#[derive(Debug, Default)]
struct Seen {
    /// The ids this thread processed (committed), one entry per time.
    processed: Vec<String>,
    duplicates: usize,
    retried: usize,
    reconnects: usize,
    deliveries: usize,
}

/// The body: one counter increment, in the batch's transaction.
fn increment<C: Connection>(conn: &mut C, id: &str) -> Result<(), AppError> {
    let updated = exec(
        conn,
        format!(
            "UPDATE batch_counters SET n = n + 1 WHERE id = {}",
            literal(id)
        ),
    )?;
    assert_eq!(updated, 1, "{id}: one counter row");
    Ok(())
}

/// Sorts one message's result into `seen`; `true` when it must be
/// redelivered, and whether the connection must be replaced.
fn sort<T: std::fmt::Debug>(
    seen: &mut Seen,
    id: &str,
    result: &Result<Outcome<T>, AppError>,
) -> (bool, bool) {
    match ack_decision(result) {
        AckDecision::Ack => {
            match result {
                Ok(Outcome::Processed(_)) => seen.processed.push(id.to_owned()),
                Ok(Outcome::Duplicate) => seen.duplicates += 1,
                Err(error) => panic!("{id}: acknowledged error {error:?}"),
            }
            (false, false)
        }
        // A copy in flight in an overlapping batch: redelivered too.
        AckDecision::Retry | AckDecision::RetryLater => {
            seen.retried += 1;
            let error = result.as_ref().expect_err("an error");
            (true, error.recovery() == Recovery::Reconnect)
        }
        AckDecision::DeadLetter => panic!("{id}: dead-lettered: {result:?}"),
    }
}

/// The ids of round `round`.
fn round_ids(round: usize) -> Vec<String> {
    ids(&format!("race-{round}"), IDS)
}

/// One thread of batches: every round, the round's ids in an order of its
/// own, cut into batches of 20 to 50, each with up to five random ids more
/// (overlap, copies) and the messages to redeliver.
fn batch_thread<B: TestBackend>(db: &B, seed: u64, start: &Barrier) -> Seen {
    let mut conn = db.connect();
    let mut rng = Rng::new(seed);
    let mut seen = Seen::default();
    for round in 0..ROUNDS {
        let all = round_ids(round);
        start.wait();
        let mut queue = all.clone();
        rng.shuffle(&mut queue);
        let mut redeliver: Vec<String> = Vec::new();
        let mut deliveries = 0;
        while !queue.is_empty() || !redeliver.is_empty() {
            deliveries += 1;
            assert!(deliveries <= MAX_DELIVERIES, "a livelock: {seen:?}");
            let size = rng.between(20, 50);
            let mut batch: Vec<String> = std::mem::take(&mut redeliver);
            while batch.len() < size {
                match queue.pop() {
                    Some(id) => batch.push(id),
                    None => break,
                }
            }
            for _ in 0..rng.between(0, 5) {
                batch.push(all[rng.between(0, IDS - 1)].clone());
            }
            rng.shuffle(&mut batch);
            let (report, _) = run_batch(&mut conn, &batch, MaxAttempts::limit(3), increment);
            seen.deliveries += 1;
            let mut reconnect = false;
            for (result, id) in report.results().iter().zip(&batch) {
                let (again, lost) = sort(&mut seen, id, result);
                if again {
                    redeliver.push(id.clone());
                }
                reconnect |= lost;
            }
            if reconnect {
                seen.reconnects += 1;
                conn = db.connect();
            }
        }
    }
    seen
}

/// One thread of single deliveries (`run_idempotent`), in an order of its
/// own, each retried until acknowledged.
fn single_thread<B: TestBackend>(db: &B, seed: u64, start: &Barrier) -> Seen {
    let mut conn = db.connect();
    let mut rng = Rng::new(seed);
    let mut seen = Seen::default();
    for round in 0..ROUNDS {
        let mut order = round_ids(round);
        start.wait();
        rng.shuffle(&mut order);
        for id in &order {
            for delivery in 0.. {
                assert!(delivery < MAX_DELIVERIES, "{id}: a livelock");
                let key = ClaimKey::new(handler(), id.as_str()).unwrap();
                let result = deliver_one(&mut conn, key, id);
                seen.deliveries += 1;
                let (again, lost) = sort(&mut seen, id, &result);
                if lost {
                    seen.reconnects += 1;
                    conn = db.connect();
                }
                if !again {
                    break;
                }
            }
        }
    }
    seen
}

fn deliver_one<C>(conn: &mut C, key: ClaimKey, id: &str) -> Result<Outcome<()>, AppError>
where
    C: LoadConnection<Backend: InboxBackend>,
{
    run_idempotent(conn, key, |conn| {
        increment(conn, id)?;
        Ok(Outcome::Processed(()))
    })
}

/// The races: every id's counter ends at exactly 1, every id is claimed,
/// and the deliveries that report `Processed` are exactly one per id.
pub fn overlapping_batches_apply_each_effect_once<B: TestBackend>() {
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let all: Vec<String> = (0..ROUNDS).flat_map(round_ids).collect();
    let rows: Vec<String> = all
        .iter()
        .map(|id| format!("({}, 0)", literal(id)))
        .collect();
    conn.batch_execute(&format!(
        "INSERT INTO batch_counters (id, n) VALUES {}",
        rows.join(", ")
    ))
    .expect("seed the counters");

    let db = Arc::new(db);
    let threads = BATCH_THREADS + SINGLE_THREADS;
    let start = Arc::new(Barrier::new(threads));
    let (done, finished) = mpsc::channel();
    let began = Instant::now();
    for thread in 0..threads {
        let (db, start, done) = (db.clone(), start.clone(), done.clone());
        std::thread::spawn(move || {
            let seed = 1 + thread as u64;
            let seen = catch_unwind(AssertUnwindSafe(|| {
                if thread < BATCH_THREADS {
                    batch_thread(&*db, seed, &start)
                } else {
                    single_thread(&*db, seed, &start)
                }
            }))
            .map_err(|payload| panic_text(&*payload));
            let _ = done.send((thread, seen));
        });
    }
    drop(done);
    let mut processed: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let (mut retried, mut duplicates, mut reconnects, mut deliveries) = (0, 0, 0, 0);
    let mut by_batches = 0;
    for _ in 0..threads {
        let (thread, seen) = match finished.recv_timeout(HANG) {
            Ok((thread, Ok(seen))) => (thread, seen),
            Ok((thread, Err(panic))) => panic!("thread {thread} failed: {panic}"),
            Err(RecvTimeoutError::Timeout) => panic!("a thread still runs after {HANG:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("a thread vanished"),
        };
        if thread < BATCH_THREADS {
            by_batches += seen.processed.len();
        }
        for id in seen.processed {
            processed.entry(id).or_default().push(thread);
        }
        retried += seen.retried;
        duplicates += seen.duplicates;
        reconnects += seen.reconnects;
        deliveries += seen.deliveries;
    }
    println!(
        "batch race {}: {threads} threads, {deliveries} deliveries, {by_batches} ids processed \
         by batches, {duplicates} duplicates, {retried} retried, {reconnects} reconnects in {:.2?}",
        B::NAME,
        began.elapsed()
    );
    let mut observer = db.connect();
    assert_eq!(
        processed.values().map(Vec::len).sum::<usize>(),
        all.len(),
        "processed across all reports: one per id"
    );
    for id in &all {
        assert_eq!(
            processed.get(id).map(Vec::len),
            Some(1),
            "{id}: processed by exactly one delivery"
        );
    }
    assert_eq!(
        observer.bigints("SELECT n AS value FROM batch_counters WHERE n <> 1"),
        Vec::<i64>::new(),
        "every counter incremented exactly once"
    );
    assert_eq!(
        observer.bigint("SELECT COUNT(*) AS value FROM batch_counters WHERE n = 1"),
        all.len() as i64
    );
    assert_eq!(
        all_claims(&mut observer),
        all.len() as i64,
        "every id claimed"
    );
    assert_eq!(all_failure_rows(&mut observer), 0, "nothing counted");
    // Every message was acknowledged: one more delivery of them all is all
    // duplicates.
    let (report, runs) = run_batch(&mut observer, &all, MaxAttempts::limit(3), increment);
    assert_all_duplicates(&report);
    assert!(runs.is_empty());
}

/// Another delivery has claimed one id of the batch and not committed yet:
/// the batch's claim waits for it. If it commits, that id is a duplicate
/// (its body never runs) and the others are processed; if it rolls back,
/// the batch processes every id.
fn waits_for_an_uncommitted_claim<B: TestBackend>(holder_commits: bool) {
    let Some((db, _conn)) = fresh::<B>() else {
        return;
    };
    let db = Arc::new(db);
    let mut holder = db.connect();
    holder
        .batch_execute(&format!(
            "BEGIN; INSERT INTO inbox_messages (handler, message_id) VALUES ({}, 'wait-x')",
            literal(HANDLER)
        ))
        .expect("claim wait-x, uncommitted");
    let batch: Vec<String> = ["wait-a", "wait-x", "wait-b"].map(String::from).to_vec();
    let delivery = {
        let (db, batch) = (db.clone(), batch.clone());
        std::thread::spawn(move || {
            let mut conn = db.connect();
            run_batch(&mut conn, &batch, MaxAttempts::limit(3), |conn, id| {
                apply(conn, id)
            })
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    holder
        .batch_execute(if holder_commits { "COMMIT" } else { "ROLLBACK" })
        .unwrap();
    let (report, runs) = delivery.join().expect("the batch");
    if holder_commits {
        assert_eq!(endings(&report), ["processed", "duplicate", "processed"]);
        assert!(!runs.contains_key("wait-x"), "{runs:?}");
    } else {
        assert_all_processed(&report, &batch);
        assert_eq!(runs.len(), 3);
    }
    let mut observer = db.connect();
    assert_eq!(all_claims(&mut observer), 3);
    assert_eq!(effects(&mut observer, "wait-x"), i64::from(!holder_commits));
}

pub fn a_claim_committed_meanwhile_is_a_duplicate<B: TestBackend>() {
    waits_for_an_uncommitted_claim::<B>(true);
}

pub fn a_claim_rolled_back_meanwhile_is_processed<B: TestBackend>() {
    waits_for_an_uncommitted_claim::<B>(false);
}

inbox_tests::backend_tests!(
    overlapping_batches_apply_each_effect_once,
    a_claim_committed_meanwhile_is_a_duplicate,
    a_claim_rolled_back_meanwhile_is_processed,
);
