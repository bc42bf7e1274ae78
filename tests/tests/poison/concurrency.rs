//! Deliveries of one id at once: a storm of always-failing deliveries
//! makes exactly one dead record and never commits an effect; a delivery
//! that succeeds while another is failing keeps the message alive.

use std::sync::{Arc, Barrier, mpsc};
use std::time::Instant;

use diesel::connection::SimpleConnection;
use inbox_runtime::{AckDecision, InboxError, ack_decision, dead_letters, recovery};
use inbox_tests::{ServerBackend, TestBackend, connection_id};

use crate::handlers::*;
use crate::support::*;

/// How each delivery of a race ended.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub failed: u32,
    pub exhausted: u32,
    pub retried: u32,
    pub duplicates: u32,
    pub runs: u32,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, other: Tally) {
        self.failed += other.failed;
        self.exhausted += other.exhausted;
        self.retried += other.retried;
        self.duplicates += other.duplicates;
        self.runs += other.runs;
    }
}

/// The most deliveries one racer makes before the test calls it a livelock.
pub const MAX_DELIVERIES: u32 = 60;

/// Sorts one delivery's result into `tally`; `true` once it is a duplicate.
pub fn tally(tally: &mut Tally, result: &Result<(), AppError>) -> bool {
    match result {
        Ok(()) => {
            tally.duplicates += 1;
            return true;
        }
        Err(AppError::Failed(_)) => tally.failed += 1,
        Err(AppError::Inbox(InboxError::AttemptsExhausted { .. })) => tally.exhausted += 1,
        // A claim that lost its lock conflicts more often than the runtime
        // retries (InnoDB under a storm of rollbacks): redelivered.
        Err(AppError::Db(error)) if recovery(error).is_retryable() => tally.retried += 1,
        Err(other) => panic!("unexpected: {other:?}"),
    }
    assert_ne!(ack_decision(result), AckDecision::Ack);
    false
}

/// What every race must leave: one dead record, no effect, and every
/// later delivery a duplicate.
pub fn assert_one_dead_record<B: TestBackend>(db: &B, total: Tally, id: &str) {
    let mut observer = db.connect();
    assert_eq!(
        total.exhausted, 1,
        "exactly one delivery reports it dead: {total:?}"
    );
    assert_eq!(all_effects(&mut observer), 0, "no effect ever committed");
    assert_eq!(claims(&mut observer, THREE, id), 1, "claimed as dead");
    let row = failure_row::<B>(&mut observer, THREE, id).expect("recorded");
    assert!(row.dead && !row.rejected, "{row:?}");
    assert!(row.attempts >= 3, "at least the limit: {row:?}");
    assert!(
        i64::from(total.runs) >= row.attempts,
        "each count is a body that ran: {total:?}, {row:?}"
    );
    assert_eq!(row.last_error, "always failing");
    let summary = dead_letters::summary(&mut observer).unwrap();
    assert_eq!(summary.len(), 1);
    assert_eq!((summary[0].handler.as_str(), summary[0].dead), (THREE, 1));
    let later = Msg::failing(id, "always failing");
    assert!(three(&mut observer, &later).is_ok());
    assert_eq!(later.runs(), 0, "a later delivery is a duplicate");
}

/// `B::RACE_THREADS` threads, each on its own connection, deliver the same
/// always-failing id until it comes back as a duplicate.
pub fn racing_failures_make_one_dead_record<B: TestBackend>() {
    let Some((db, _conn)) = fresh::<B>() else {
        return;
    };
    let db = Arc::new(db);
    let threads = B::RACE_THREADS;
    let barrier = Arc::new(Barrier::new(threads));
    let (done, results) = mpsc::channel();
    let started = Instant::now();
    for _ in 0..threads {
        let (db, barrier, done) = (db.clone(), barrier.clone(), done.clone());
        std::thread::spawn(move || {
            let mut conn = db.connect();
            let mut seen = Tally::default();
            barrier.wait();
            for _ in 0..MAX_DELIVERIES {
                let msg = Msg::failing("race-1", "always failing");
                let result = three(&mut conn, &msg);
                seen.runs += msg.runs();
                if tally(&mut seen, &result) {
                    let _ = done.send(Some(seen));
                    return;
                }
            }
            let _ = done.send(None);
        });
    }
    drop(done);
    let mut total = Tally::default();
    for _ in 0..threads {
        match results.recv_timeout(HANG) {
            Ok(Some(seen)) => total += seen,
            Ok(None) => panic!("a racer never saw a duplicate in {MAX_DELIVERIES} deliveries"),
            Err(error) => panic!("a racer hung or panicked: {error}"),
        }
    }
    println!(
        "poison race {}: threads={threads} {total:?} in {:.2?}",
        B::NAME,
        started.elapsed()
    );
    assert_eq!(
        total.duplicates as usize, threads,
        "every racer ends on a duplicate"
    );
    assert_one_dead_record(&*db, total, "race-1");
}

/// A delivery fails the third time while another delivery of the message
/// succeeds: the failing one's short transaction is held back (the test
/// holds its `inbox_failures` row) until the other has committed. The
/// message is processed, never dead: the failing delivery reports the
/// body's error, and its count and dead mark roll back.
pub fn a_success_racing_a_failure_is_never_dead<B: ServerBackend>() {
    if B::skipped_without_sessions("it watches its connection's server session by id") {
        return;
    }
    let Some((db, mut conn)) = fresh::<B>() else {
        return;
    };
    let mut observer = db.connect();
    for attempt in 1..=2 {
        let result = three(&mut conn, &Msg::failing("m-1", &format!("boom {attempt}")));
        assert!(matches!(result, Err(AppError::Failed(_))), "{result:?}");
    }
    let mut holder = db.connect();
    holder.batch_execute("BEGIN").unwrap();
    holder
        .batch_execute(
            "UPDATE inbox_failures SET attempts = attempts \
             WHERE handler = 'poison.three' AND message_id = 'm-1'",
        )
        .unwrap();

    let mut failing = db.connect();
    let failing_id = connection_id::<B>(&mut failing);
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let msg = Msg::failing("m-1", "boom 3");
        let result = three(&mut failing, &msg);
        let _ = done.send((result, msg.runs(), failing));
    });
    // Its body failed and rolled back; its count waits for the holder.
    wait_until(
        &mut observer,
        &waits_in_sql::<B>(failing_id, "INSERT INTO inbox_failures"),
    );

    let fine = Msg::succeeding("m-1");
    three(&mut conn, &fine).expect("the other delivery processes the message");
    assert_eq!(fine.runs(), 1);
    assert_eq!(effects(&mut observer, "m-1"), 1, "committed");

    holder.batch_execute("COMMIT").unwrap();
    let (result, runs, mut failing) = result
        .recv_timeout(HANG)
        .expect("the failing delivery ends");
    assert_eq!(runs, 1);
    assert!(
        matches!(&result, Err(AppError::Failed(text)) if text == "boom 3"),
        "the body's error, not exhausted attempts: {result:?}"
    );
    assert_eq!(
        failure_row::<B>(&mut observer, THREE, "m-1"),
        counted(2, "boom 2"),
        "the short transaction rolled back"
    );
    assert!(dead_letters::summary(&mut observer).unwrap().is_empty());
    assert_eq!(claims(&mut observer, THREE, "m-1"), 1);
    assert_eq!(effects(&mut observer, "m-1"), 1);
    let again = Msg::failing("m-1", "never runs");
    assert!(three(&mut failing, &again).is_ok(), "a duplicate");
    assert_eq!(again.runs(), 0);
}

inbox_tests::backend_tests! {
    racing_failures_make_one_dead_record;
    only [postgres, mysql]: a_success_racing_a_failure_is_never_dead;
}
