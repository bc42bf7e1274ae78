//! A copy of a message delivered while its first delivery is still in
//! flight (a broker redelivered a slow message): with a bounded claim
//! (`ClaimWait`), the copy is answered `InProgress` within the bound
//! instead of holding its worker for the first delivery's whole body;
//! nothing ran for it and nothing was counted. Once the first delivery
//! commits, copies are duplicates; if it fails, a later copy processes the
//! message, once.

// The storms and the bound run on the servers only.
#![cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use inbox_runtime::{AckDecision, ClaimWait, InboxError, Options, Outcome, Recovery};
use inbox_tests::failure_rows::failure_row;

use crate::support::*;

const HANDLER: &str = "e2e.in_flight";
/// How long the first delivery's body holds its claim.
const HOLD: Duration = Duration::from_secs(3);
/// The copies' bound (MariaDB counts whole seconds).
const BOUND: Duration = Duration::from_secs(1);
/// What a copy may take beyond its bound: the claim's round trips, and a
/// two-CPU machine running the suites side by side (a copy answered after
/// 1.25 s in one clean-clone run, with 250 ms allowed). Every bound plus
/// the slack stays under what the first delivery holds, so a copy that
/// waited for it still fails.
const SLACK: Duration = Duration::from_millis(600);
/// Copies of the slow message, spread over the workers.
const COPIES: usize = 50;
const WORKERS: usize = 8;

/// One delivery of `id` through the runtime, its claim waiting at most
/// `wait`: the body records an effect, then holds `hold`, then fails when
/// told to. `claimed` hears when the body starts (the claim is taken).
fn deliver<C: Effects>(
    conn: &mut C,
    id: &str,
    wait: ClaimWait,
    hold: Duration,
    fail: bool,
    claimed: Option<mpsc::Sender<()>>,
) -> Result<Outcome<()>, AppError> {
    let options = Options::new().claim_wait(wait);
    inbox_runtime::run_idempotent_with(conn, key(HANDLER, id), options, |conn: &mut C| {
        conn.record_effect(HANDLER, id, 0, "in_flight")?;
        if let Some(claimed) = &claimed {
            claimed.send(()).expect("the test listens");
        }
        thread::sleep(hold);
        match fail {
            true => Err(AppError::Failed("the first delivery fails")),
            false => Ok(Outcome::Processed(())),
        }
    })
}

/// Starts the first delivery of `id` on a connection of its own and
/// returns once its claim is taken (its body runs for `hold`).
fn first_delivery<B: E2e>(
    db: &B,
    id: &str,
    hold: Duration,
    fail: bool,
) -> thread::JoinHandle<Result<Outcome<()>, AppError>> {
    let mut conn = db.connect();
    let id = id.to_owned();
    let (claimed, heard) = mpsc::channel();
    let first = thread::spawn(move || {
        deliver(
            &mut conn,
            &id,
            ClaimWait::Unbounded,
            hold,
            fail,
            Some(claimed),
        )
    });
    heard
        .recv_timeout(Duration::from_secs(10))
        .expect("the first delivery claims its id");
    first
}

fn is_in_progress(result: &Result<Outcome<()>, AppError>) -> bool {
    matches!(result, Err(AppError::Inbox(InboxError::InProgress { .. })))
}

/// 50 copies of a message whose first delivery holds its claim for 3 s,
/// delivered by 8 workers that also deliver other ids in between: the
/// body runs once; every copy is answered within the bound (plus slack),
/// `InProgress` while the first delivery runs and a duplicate after it
/// committed; no copy is counted as a failed attempt; the other ids are
/// never held up by the slow one.
pub fn copies_of_a_slow_delivery_are_in_progress_within_the_bound<B: E2e>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let slow = "slow-1";
    let first = first_delivery(&db, slow, HOLD, false);
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let mut conn = db.connect();
            thread::spawn(move || {
                let mut copies = Vec::new();
                let mut others = Vec::new();
                for (round, _) in (worker..COPIES).step_by(WORKERS).enumerate() {
                    let other = format!("other-{worker}-{round}");
                    let began = Instant::now();
                    let result = deliver(
                        &mut conn,
                        &other,
                        ClaimWait::Bounded(BOUND),
                        Duration::ZERO,
                        false,
                        None,
                    );
                    others.push((began.elapsed(), result));
                    let began = Instant::now();
                    let result = deliver(
                        &mut conn,
                        slow,
                        ClaimWait::Bounded(BOUND),
                        Duration::ZERO,
                        false,
                        None,
                    );
                    copies.push((began.elapsed(), result));
                }
                (copies, others)
            })
        })
        .collect();
    let mut copies = Vec::new();
    let mut others = Vec::new();
    for worker in workers {
        let (worker_copies, worker_others) = worker.join().expect("no panic");
        copies.extend(worker_copies);
        others.extend(worker_others);
    }
    let first = first.join().expect("no panic");
    assert_eq!(
        first.expect("the first delivery commits"),
        Outcome::Processed(())
    );
    assert!(started.elapsed() >= HOLD - Duration::from_millis(100));

    assert_eq!(copies.len(), COPIES);
    let in_progress = copies
        .iter()
        .filter(|(_, result)| is_in_progress(result))
        .count();
    let duplicates = copies
        .iter()
        .filter(|(_, result)| matches!(result, Ok(Outcome::Duplicate)))
        .count();
    let slowest_copy = copies
        .iter()
        .map(|(took, _)| *took)
        .max()
        .unwrap_or_default();
    println!(
        "{}: {COPIES} copies of a message held {HOLD:?}, bound {BOUND:?}: {in_progress} in progress, \
         {duplicates} duplicates, slowest answer {slowest_copy:?}",
        B::NAME
    );
    assert_eq!(
        in_progress + duplicates,
        COPIES,
        "every copy is in progress or a duplicate: {copies:?}"
    );
    assert!(
        in_progress >= WORKERS,
        "the first copy of each worker meets the first delivery in flight"
    );
    assert!(
        slowest_copy <= BOUND + SLACK,
        "a copy waited {slowest_copy:?}"
    );
    for (took, result) in &copies {
        if is_in_progress(result) {
            let Err(AppError::Inbox(error @ InboxError::InProgress { waited, .. })) = result else {
                unreachable!()
            };
            assert!(
                *waited >= BOUND - Duration::from_millis(50),
                "gave up early: {waited:?}"
            );
            assert_eq!(error.recovery(), Recovery::RetryLater);
            assert_eq!(inbox_runtime::ack_decision(result), AckDecision::RetryLater);
            assert!(*took <= BOUND + SLACK);
        }
    }
    assert_eq!(observer.effects_by(HANDLER, slow), 1, "the body ran once");
    assert_eq!(
        failure_row::<B>(&mut observer, HANDLER, slow),
        None,
        "no copy is counted"
    );

    let mut other_times: Vec<Duration> = others
        .iter()
        .map(|(took, result)| {
            assert!(matches!(result, Ok(Outcome::Processed(()))), "{result:?}");
            *took
        })
        .collect();
    other_times.sort();
    let p50 = other_times[other_times.len() / 2];
    let max = *other_times.last().expect("other ids");
    println!(
        "{}: the other ids meanwhile: p50 {p50:?}, max {max:?}",
        B::NAME
    );
    assert!(
        max < BOUND,
        "another id waited {max:?}: it waited on the slow one"
    );

    let mut conn = db.connect();
    let after = deliver(
        &mut conn,
        slow,
        ClaimWait::Bounded(BOUND),
        Duration::ZERO,
        false,
        None,
    );
    assert_eq!(after.expect("a duplicate"), Outcome::Duplicate);
}

/// The first delivery fails after its copy was answered `InProgress`: a
/// later copy processes the message, once; only the first delivery's
/// failure is counted.
pub fn after_the_first_delivery_fails_a_later_copy_processes_it<B: E2e>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let id = "fails-first";
    let first = first_delivery(&db, id, Duration::from_millis(1500), true);
    let mut conn = db.connect();
    let copy = deliver(
        &mut conn,
        id,
        ClaimWait::Bounded(BOUND),
        Duration::ZERO,
        false,
        None,
    );
    assert!(is_in_progress(&copy), "{copy:?}");
    assert!(matches!(
        first.join().expect("no panic"),
        Err(AppError::Failed(_))
    ));
    let later = deliver(
        &mut conn,
        id,
        ClaimWait::Bounded(BOUND),
        Duration::ZERO,
        false,
        None,
    );
    assert_eq!(later.expect("processed"), Outcome::Processed(()));
    assert_eq!(
        observer.effects_by(HANDLER, id),
        1,
        "the failed delivery's effect rolled back"
    );
    let failures = failure_row::<B>(&mut observer, HANDLER, id).expect("the failure is counted");
    assert_eq!(failures.attempts, 1, "the in-progress copy is not counted");
    let again = deliver(
        &mut conn,
        id,
        ClaimWait::Bounded(BOUND),
        Duration::ZERO,
        false,
        None,
    );
    assert_eq!(again.expect("a duplicate"), Outcome::Duplicate);
}

/// `ClaimWait::Unbounded` keeps the wait: the copy waits for the first
/// delivery's body and is a duplicate once it commits.
pub fn an_unbounded_claim_waits_for_the_first_delivery<B: E2e>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let id = "waited-for";
    let hold = Duration::from_millis(1500);
    let first = first_delivery(&db, id, hold, false);
    let began = Instant::now();
    let mut conn = db.connect();
    let copy = deliver(
        &mut conn,
        id,
        ClaimWait::Unbounded,
        Duration::ZERO,
        false,
        None,
    );
    let waited = began.elapsed();
    assert_eq!(copy.expect("a duplicate"), Outcome::Duplicate);
    assert!(
        waited >= hold - Duration::from_millis(300),
        "waited only {waited:?}"
    );
    let committed = first.join().expect("no panic").expect("committed");
    assert_eq!(committed, Outcome::Processed(()));
    assert_eq!(observer.effects_by(HANDLER, id), 1);
}

/// A bound longer than any server's lock wait (`Duration::MAX`, as a
/// "never give up" might be written) is the longest the server takes: the
/// copy waits for the first delivery's body and is a duplicate, on every
/// backend, its own claim text and the bound's arithmetic included.
pub fn the_longest_bound_waits_as_long_as_the_server_allows<B: E2e>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    for (n, bound) in [Duration::MAX, Duration::from_secs(u64::MAX)]
        .into_iter()
        .enumerate()
    {
        let id = format!("longest-bound-{n}");
        let hold = Duration::from_millis(1200);
        let first = first_delivery(&db, &id, hold, false);
        let began = Instant::now();
        let mut conn = db.connect();
        let copy = deliver(
            &mut conn,
            &id,
            ClaimWait::Bounded(bound),
            Duration::ZERO,
            false,
            None,
        );
        let waited = began.elapsed();
        assert_eq!(copy.expect("a duplicate"), Outcome::Duplicate, "{bound:?}");
        assert!(
            waited >= hold - Duration::from_millis(300),
            "{bound:?}: waited only {waited:?}"
        );
        let committed = first.join().expect("no panic").expect("committed");
        assert_eq!(committed, Outcome::Processed(()));
        assert_eq!(observer.effects_by(HANDLER, &id), 1);
    }
}

/// A batch holding an id whose first delivery is in flight: that message
/// alone is `InProgress`; the others are processed.
pub fn a_batch_answers_in_progress_for_its_in_flight_message_alone<B: E2e>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let first = first_delivery(&db, "batch-2", HOLD, false);
    let mut conn = db.connect();
    let handler = inbox_runtime::HandlerName::new(HANDLER).expect("a valid name");
    let began = Instant::now();
    let report = inbox_runtime::run_idempotent_batch_with(
        &mut conn,
        &handler,
        &["batch-1", "batch-2", "batch-3"],
        |id| *id,
        Options::new().claim_wait(ClaimWait::Bounded(BOUND)),
        |conn: &mut B::Connection, id: &&str| conn.record_effect(HANDLER, id, 0, "batch"),
    );
    let took = began.elapsed();
    let results = report.into_results();
    assert!(
        matches!(results[0], Ok(Outcome::Processed(()))),
        "{results:?}"
    );
    let in_progress = results[1].as_ref().err().and_then(InboxError::find_in);
    assert!(
        matches!(in_progress, Some(InboxError::InProgress { .. })),
        "{results:?}"
    );
    assert_eq!(
        inbox_runtime::ack_decision(&results[1]),
        AckDecision::RetryLater
    );
    assert!(
        matches!(results[2], Ok(Outcome::Processed(()))),
        "{results:?}"
    );
    // The batch statement waits the bound, then the ids are claimed one by
    // one, the in-flight one waiting the bound again.
    assert!(took <= 2 * BOUND + SLACK, "the batch took {took:?}");
    let committed = first.join().expect("no panic").expect("committed");
    assert_eq!(committed, Outcome::Processed(()));
    assert_eq!(observer.effects_by(HANDLER, "batch-1"), 1);
    assert_eq!(
        observer.effects_by(HANDLER, "batch-2"),
        1,
        "the first delivery's only"
    );
    assert_eq!(observer.effects_by(HANDLER, "batch-3"), 1);
}

/// SQLite has one writer at a time: a second delivery waits for the write
/// lock, whatever message holds it, as its connection's `busy_timeout`
/// says, and a claim refused as busy is `InProgress`.
pub fn a_busy_database_answers_in_progress<B: E2e>() {
    let Some((db, mut observer)) = fresh::<B>() else {
        return;
    };
    let first = first_delivery(&db, "busy-1", Duration::from_millis(1500), false);
    let mut conn = db.connect();
    conn.batch_execute("PRAGMA busy_timeout = 300")
        .expect("set the busy timeout");
    let began = Instant::now();
    let copy = deliver(
        &mut conn,
        "busy-1",
        ClaimWait::Bounded(BOUND),
        Duration::ZERO,
        false,
        None,
    );
    let took = began.elapsed();
    assert!(is_in_progress(&copy), "{copy:?}");
    println!("sqlite: a copy answered in progress after {took:?} (busy_timeout 300 ms)");
    assert!(took <= Duration::from_millis(300) + SLACK, "took {took:?}");
    let committed = first.join().expect("no panic").expect("committed");
    assert_eq!(committed, Outcome::Processed(()));
    let after = deliver(
        &mut conn,
        "busy-1",
        ClaimWait::Bounded(BOUND),
        Duration::ZERO,
        false,
        None,
    );
    assert_eq!(after.expect("a duplicate"), Outcome::Duplicate);
    assert_eq!(observer.effects_by(HANDLER, "busy-1"), 1);
    assert_eq!(failure_row::<B>(&mut observer, HANDLER, "busy-1"), None);
}

/// The bound is the claim's alone: the body (single, and each body of a
/// batch) waits for locks as the application set its session.
pub fn the_body_waits_as_the_application_says<B: E2e>() {
    let Some((db, _observer)) = fresh::<B>() else {
        return;
    };
    let mut conn = db.connect();
    let (set, read, expected) = match B::NAME {
        "postgres" => (
            "SET lock_timeout = '7s'",
            "(SELECT setting::int FROM pg_settings WHERE name = 'lock_timeout')",
            7000,
        ),
        _ => (
            "SET SESSION innodb_lock_wait_timeout = 7",
            "@@innodb_lock_wait_timeout",
            7,
        ),
    };
    conn.batch_execute(set).expect("the application's setting");
    let options = Options::new().claim_wait(ClaimWait::Bounded(BOUND));
    let seen = inbox_runtime::run_idempotent_with(
        &mut conn,
        key(HANDLER, "setting-1"),
        options,
        |conn: &mut B::Connection| Ok::<_, AppError>(Outcome::Processed(conn.select_i32(read)?)),
    );
    assert_eq!(
        seen.expect("processed"),
        Outcome::Processed(expected),
        "in the body"
    );
    let handler = inbox_runtime::HandlerName::new(HANDLER).expect("a valid name");
    let report = inbox_runtime::run_idempotent_batch_with(
        &mut conn,
        &handler,
        &["setting-2", "setting-3"],
        |id| *id,
        options,
        |conn: &mut B::Connection, _id: &&str| conn.select_i32(read),
    );
    for result in report.into_results() {
        assert_eq!(
            result.expect("processed"),
            Outcome::Processed(expected),
            "in a batch body"
        );
    }
    assert_eq!(
        conn.select_i32(read).expect("read"),
        expected,
        "after the deliveries"
    );
}

/// The answer reaches the consumer through an application error that
/// wraps the inbox's transparently (`#[error(transparent)]` forwards
/// `source()`, hiding the inbox error itself): redeliver later.
#[test]
fn in_progress_reads_as_retry_later_through_a_transparent_wrapper() {
    let error = || InboxError::InProgress {
        handler: HANDLER.to_owned(),
        message_id: "m-1".to_owned(),
        waited: BOUND,
    };
    assert_eq!(error().recovery(), Recovery::RetryLater);
    assert!(error().recovery().is_retryable());
    let direct: Result<(), InboxError> = Err(error());
    assert_eq!(
        inbox_runtime::ack_decision(&direct),
        AckDecision::RetryLater
    );
    let wrapped: Result<(), AppError> = Err(AppError::Inbox(error()));
    assert_eq!(
        inbox_runtime::ack_decision(&wrapped),
        AckDecision::RetryLater
    );
    assert!(
        error().to_string().contains("redeliver the message later"),
        "the text says what to do"
    );
}

inbox_tests::backend_tests! {
    only [postgres, mysql]:
        copies_of_a_slow_delivery_are_in_progress_within_the_bound,
        a_batch_answers_in_progress_for_its_in_flight_message_alone,
        after_the_first_delivery_fails_a_later_copy_processes_it,
        the_body_waits_as_the_application_says;
    an_unbounded_claim_waits_for_the_first_delivery,
        the_longest_bound_waits_as_long_as_the_server_allows;
    only [sqlite]: a_busy_database_answers_in_progress;
}
