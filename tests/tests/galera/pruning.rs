//! `Prune::run` on all three nodes at once: alone, then while handlers on
//! every node claim new ids and redeliver recent ones.
//!
//! A batch's `FOR UPDATE SKIP LOCKED` is node-local: pruners on different
//! nodes pick the same oldest rows, and all but the first to commit are
//! refused at COMMIT (certification) or aborted under way (brute force).
//! The runtime retries a batch that lost a lock conflict (`BATCH_ATTEMPTS`
//! tries, `is_lock_conflict`), the refused COMMIT included. Counted here:
//! each pruner session's COMMITs and ROLLBACKs (Diesel rolls back after a
//! refused COMMIT, so every failed batch attempt is one ROLLBACK), the runs
//! that failed and with what, and the cluster's certification failures
//! and brute-force aborts. With pruners alone every certification failure
//! is a refused batch COMMIT, so "runs failed: 0" beside certification
//! failures shows refused COMMITs retried.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use inbox_runtime::{
    InboxError, Outcome, Prune, Recovery, RetentionPolicy, is_lock_conflict, recovery,
};
use inbox_tests::GaleraCluster;
use inbox_tests::galera::NODES;

use crate::support::{Delivery, HANDLER, apply, conflicts, connect, report};

const EXPIRED: usize = 20_000;
const KEPT: usize = 1_000;
const BATCH: u32 = 500;
/// A pruner making this many runs without catching up fails the test.
const MAX_RUNS: usize = 200;
/// Each live handler claims at least this many ids.
const MIN_CLAIMS: usize = 150;

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The inbox's ids that match the `LIKE` pattern `pattern`.
fn count(conn: &mut MysqlConnection, pattern: &str) -> i64 {
    diesel::sql_query(COUNT_LIKE_SQL)
        .bind::<Text, _>(pattern)
        .get_result::<Count>(conn)
        .expect("count")
        .n
}

/// Counts the inbox's ids that match a `LIKE` pattern.
const COUNT_LIKE_SQL: &str = "SELECT COUNT(*) AS n FROM inbox_messages WHERE message_id LIKE ?";

/// A connection to `node` whose reads wait until the node has applied every
/// write the cluster committed before them (`wsrep_sync_wait`).
fn causal_reader(cluster: &GaleraCluster, node: usize) -> MysqlConnection {
    let mut conn = connect(cluster, node);
    diesel::sql_query("SET SESSION wsrep_sync_wait = 1")
        .execute(&mut conn)
        .expect("causal reads");
    conn
}

/// This session's counter `name` (`Com_commit`, `Com_rollback`).
fn session_counter(conn: &mut MysqlConnection, name: &str) -> i64 {
    diesel::sql_query(
        "SELECT CAST(VARIABLE_VALUE AS SIGNED) AS n FROM information_schema.SESSION_STATUS \
         WHERE VARIABLE_NAME = UPPER(?)",
    )
    .bind::<Text, _>(name)
    .get_result::<Count>(conn)
    .expect("a session counter")
    .n
}

/// `count` ids `<prefix>-<i>` of the test handler, received `days_ago`.
fn seed(cluster: &GaleraCluster, prefix: &str, rows: usize, days_ago: u32) {
    let seeded = rows as i64;
    let mut conn = connect(cluster, 0);
    diesel::sql_query(format!(
        "INSERT INTO inbox_messages (handler, message_id, received_at) \
         SELECT ?, CONCAT(?, '-', seq), UTC_TIMESTAMP(6) - INTERVAL {days_ago} DAY \
         FROM seq_0_to_{}",
        rows - 1
    ))
    .bind::<Text, _>(HANDLER)
    .bind::<Text, _>(prefix)
    .execute(&mut conn)
    .expect("seed the inbox");
    // Every node has applied the seed before the pruners start: a causal
    // read waits for it.
    for node in 0..NODES {
        let mut conn = causal_reader(cluster, node);
        assert_eq!(count(&mut conn, &format!("{prefix}-%")), seeded);
    }
}

#[derive(Default, Debug)]
struct PrunerRun {
    runs: usize,
    failed: Vec<String>,
    /// ROLLBACKs issued in each failed run (a batch's failed tries).
    rollbacks_in_failed_runs: Vec<i64>,
    rows: u64,
    batches: u64,
    commits: i64,
    rollbacks: i64,
}

fn pruner(cluster: &GaleraCluster, node: usize, start: &std::sync::Barrier) -> PrunerRun {
    let prune = Prune::new(RetentionPolicy::parse("7d", "2d").expect("policy")).batch_size(BATCH);
    let mut conn = connect(cluster, node);
    let mut run = PrunerRun::default();
    let (commits, rollbacks) = (
        session_counter(&mut conn, "Com_commit"),
        session_counter(&mut conn, "Com_rollback"),
    );
    start.wait();
    loop {
        assert!(
            run.runs < MAX_RUNS,
            "pruner on node {node} never caught up: {run:?}"
        );
        run.runs += 1;
        let before = session_counter(&mut conn, "Com_rollback");
        match prune.run(&mut conn) {
            Ok(report) => {
                run.rows += report.rows_deleted;
                run.batches += report.batches;
                if report.caught_up && report.rows_deleted == 0 {
                    break;
                }
            }
            Err(error) => {
                let cause = error.error();
                run.failed.push(format!(
                    "{cause:?} (recovery {:?}, lock conflict {})",
                    cause.recovery(),
                    matches!(cause, InboxError::Database(e) if is_lock_conflict(e))
                ));
                run.rollbacks_in_failed_runs
                    .push(session_counter(&mut conn, "Com_rollback") - before);
                run.rows += error.report().rows_deleted;
                run.batches += error.report().batches;
                if cause.recovery() == Recovery::Reconnect {
                    conn = connect(cluster, node);
                }
            }
        }
    }
    run.commits = session_counter(&mut conn, "Com_commit") - commits;
    run.rollbacks = session_counter(&mut conn, "Com_rollback") - rollbacks;
    run
}

#[derive(Default)]
struct HandlerRun {
    claimed: usize,
    kept_duplicates: usize,
    errors: std::collections::BTreeMap<String, usize>,
    never: Vec<String>,
}

/// Claims new ids and redelivers kept ones on `node` until `stop`.
fn live_handler(
    cluster: &GaleraCluster,
    node: usize,
    stop: &AtomicBool,
    prefix: &str,
) -> HandlerRun {
    let mut conn = connect(cluster, node);
    let mut run = HandlerRun::default();
    let body = AtomicU32::new(0);
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) || run.claimed < MIN_CLAIMS {
        for (id, new) in [
            (format!("{prefix}-{node}-{n}"), true),
            (
                format!("prune-kept-{}", (node * 7_919 + n * 31) % KEPT),
                false,
            ),
        ] {
            let mut tries = 0;
            loop {
                tries += 1;
                assert!(tries <= 50, "{id} failed 50 deliveries: {:?}", run.errors);
                match apply(&mut conn, &Delivery::new(id.clone(), node, &body)) {
                    Ok(Outcome::Processed(())) if new => run.claimed += 1,
                    Ok(Outcome::Duplicate) if !new => run.kept_duplicates += 1,
                    Ok(outcome) => panic!("{id}: {outcome:?} (new: {new})"),
                    Err(error) => {
                        *run.errors.entry(error.to_string()).or_default() += 1;
                        match recovery(&error) {
                            Recovery::Retry => {}
                            Recovery::Reconnect => conn = connect(cluster, node),
                            _ => run.never.push(format!("{error:?}")),
                        }
                        thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                }
                break;
            }
        }
        n += 1;
    }
    run
}

fn phase(cluster: &GaleraCluster, label: &str, with_handlers: bool) {
    let old = format!("prune-old-{label}");
    seed(cluster, &old, EXPIRED, 10);
    let (cert_before, bf_before) = conflicts(cluster);
    let start = std::sync::Barrier::new(NODES + 1);
    let stop = AtomicBool::new(false);
    let live = format!("prune-live-{label}");
    let started = Instant::now();
    let (pruners, handlers) = thread::scope(|scope| {
        let handlers: Vec<_> = (0..NODES)
            .filter(|_| with_handlers)
            .map(|node| {
                let (stop, live) = (&stop, &live);
                scope.spawn(move || live_handler(cluster, node, stop, live))
            })
            .collect();
        let pruners: Vec<_> = (0..NODES)
            .map(|node| {
                let start = &start;
                scope.spawn(move || pruner(cluster, node, start))
            })
            .collect();
        start.wait();
        let pruners: Vec<PrunerRun> = pruners
            .into_iter()
            .map(|p| p.join().expect("a pruner panicked"))
            .collect();
        stop.store(true, Ordering::SeqCst);
        let handlers: Vec<HandlerRun> = handlers
            .into_iter()
            .map(|h| h.join().expect("a handler panicked"))
            .collect();
        (pruners, handlers)
    });
    let elapsed = started.elapsed();
    let (cert_after, bf_after) = conflicts(cluster);
    for (node, run) in pruners.iter().enumerate() {
        report!(
            "pruning {label}, pruner on node {node}: {} runs ({} failed), {} rows in {} batches; \
             session: {} COMMITs, {} ROLLBACKs (failed batch tries); \
             ROLLBACKs in each failed run: {:?}",
            run.runs,
            run.failed.len(),
            run.rows,
            run.batches,
            run.commits,
            run.rollbacks,
            run.rollbacks_in_failed_runs
        );
        for failure in &run.failed {
            report!("pruning {label}, node {node}, failed run: {failure}");
        }
    }
    let failed_batch_tries: i64 = pruners.iter().map(|r| r.rollbacks).sum();
    let failed_runs: usize = pruners.iter().map(|r| r.failed.len()).sum();
    report!(
        "pruning {label}: {:.2} s; {} rows deleted; {} failed batch tries, {} failed runs; \
         cluster: {} certification failures (refused COMMITs), {} brute-force aborts",
        elapsed.as_secs_f64(),
        pruners.iter().map(|r| r.rows).sum::<u64>(),
        failed_batch_tries,
        failed_runs,
        cert_after - cert_before,
        bf_after - bf_before
    );
    for (node, run) in handlers.iter().enumerate() {
        report!(
            "pruning {label}, handler on node {node}: {} new ids claimed, {} kept ids seen \
             as duplicates, errors {:?}",
            run.claimed,
            run.kept_duplicates,
            run.errors
        );
        assert!(
            run.never.is_empty(),
            "errors classified Never: {:?}",
            run.never
        );
    }

    // A last pass on one node: whatever the racing runs left is removed
    // (a run that failed leaves its rows for the next run).
    let mut conn = connect(cluster, 0);
    Prune::new(RetentionPolicy::parse("7d", "2d").expect("policy"))
        .run(&mut conn)
        .expect("a final pass alone");
    for node in 0..NODES {
        let mut conn = causal_reader(cluster, node);
        assert_eq!(
            count(&mut conn, &format!("{old}-%")),
            0,
            "expired ids left on node {node}"
        );
        assert_eq!(
            count(&mut conn, "prune-kept-%"),
            KEPT as i64,
            "kept ids on node {node}"
        );
        let claimed: usize = handlers.iter().map(|h| h.claimed).sum();
        assert_eq!(
            count(&mut conn, &format!("{live}-%")),
            claimed as i64,
            "live claims on node {node}"
        );
    }
}

pub fn pruners_on_every_node(cluster: &GaleraCluster) {
    seed(cluster, "prune-kept", KEPT, 6);
    phase(cluster, "alone", false);
    phase(cluster, "with-handlers", true);
}
