//! A race of tasks on a multi-threaded runtime, each delivering every id
//! in its own order on a pooled connection: each id applied exactly once.

use std::time::Instant;

use inbox_runtime::Outcome;
use inbox_runtime::background::AsyncPool;
use inbox_tests::{AsyncSqlRows, ServerBackend};

use crate::handlers::*;
use crate::support::*;

pub async fn racing_tasks_apply_each_id_exactly_once<B: ServerBackend>() {
    const TASKS: usize = 16;
    const IDS: usize = 500;
    let Some((db, mut conn)) = fresh::<B>().await else {
        return;
    };
    let pool = B::deadpool(db.url(), TASKS);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(TASKS));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..TASKS {
        let pool = pool.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(assert_send(async move {
            let mut object = pool.checkout().await.expect("a pooled connection per task");
            let mut order: Vec<usize> = (0..IDS).collect();
            XorShift::new(worker as u64 + 1).shuffle(&mut order);
            barrier.wait().await;
            let (mut processed, mut duplicates) = (0_usize, 0_usize);
            for i in order {
                let msg = Msg::new(format!("race-{i}")).by(worker as i32);
                match record_deadpool(&mut object, &msg).await {
                    Ok(Outcome::Processed(())) => processed += 1,
                    Ok(Outcome::Duplicate) => duplicates += 1,
                    Err(error) => panic!("task {worker} failed on {}: {error:?}", msg.id),
                }
            }
            (processed, duplicates)
        })));
    }
    let (mut processed, mut duplicates) = (0, 0);
    for task in tasks {
        let (p, d) = task.await.expect("no task failed");
        processed += p;
        duplicates += d;
    }
    let elapsed = started.elapsed();
    let total: i64 = all_effects(&mut conn).await;
    let ids: Vec<String> = conn
        .texts("SELECT message_id AS value FROM async_effects")
        .await;
    let distinct = ids.iter().collect::<std::collections::HashSet<_>>().len() as i64;
    let claimed: i64 = all_claims(&mut conn).await;
    println!(
        "async race {}: tasks={TASKS} ids={IDS} deliveries={} processed={processed} duplicates={duplicates} effects={total} inbox_rows={claimed} in {:.2?}",
        B::NAME,
        TASKS * IDS,
        elapsed
    );
    assert_eq!(processed, IDS);
    assert_eq!(processed + duplicates, TASKS * IDS);
    assert_eq!(
        (total, distinct, claimed),
        (IDS as i64, IDS as i64, IDS as i64)
    );
}

inbox_tests::backend_tests!(async (multi_thread = 4) only [postgres, mysql]:
    racing_tasks_apply_each_id_exactly_once,
);
