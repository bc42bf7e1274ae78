//! The relay as a tokio task over a diesel-async pool (deadpool), on
//! PostgreSQL and MariaDB: the thread's loop with an async front end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inbox_runtime::outbox::{BackgroundRelay, OutgoingMessage, Relay, RelayRound};
use inbox_tests::ServerBackend;
use inbox_tests::terminate;

use crate::support::*;

inbox_tests::backend_tests! {
    async(multi_thread = 2) only [postgres, mysql]:
    a_relay_task_drains_follows_new_commits_and_survives_a_panic;
    async(multi_thread = 2) only [postgres]:
    a_listening_relay_task_wakes_on_commit_and_listens_again_after_a_kill;
}

/// The task: the backlog drained in key order, a message committed while
/// it idles picked up on `run_now`, a panicking publisher caught (the
/// task goes on, the message goes out when its lease runs out), and
/// `stop` ends it.
pub async fn a_relay_task_drains_follows_new_commits_and_survives_a_panic<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    inbox_tests::quiet_deliberate_panics();
    let mut conn = db.connect();
    send_all(&mut conn, &backlog());
    let flaky = Flaky {
        broker: Broker::default(),
        healed: Arc::new(Mutex::new(true)),
        panicked: Arc::new(Mutex::new(true)),
    };
    let rounds = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&rounds);
    // Rounds that found nothing to lease: the relay idles after one.
    let idle_rounds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let idled = Arc::clone(&idle_rounds);
    let relay = BackgroundRelay::new(Relay::new().batch_size(7).lease(Duration::from_secs(1)))
        .idle_wait(Duration::from_secs(3600))
        .spawn_task(B::deadpool(db.url(), 2), flaky.clone(), move |round| {
            if matches!(round, RelayRound::Done(report) if report.is_idle()) {
                idled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            seen.lock().unwrap().push(round.is_ok());
        });
    eventually_async("the backlog", || flaky.broker.payloads().len() == 30).await;
    assert_keys_in_order(&flaky.broker.payloads());
    // The relay runs rounds until one finds nothing, then idles: a message
    // committed before that round would go out with it.
    eventually_async("an idle round after the backlog", || {
        idle_rounds.load(std::sync::atomic::Ordering::SeqCst) > 0
    })
    .await;

    *flaky.panicked.lock().unwrap() = false;
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "late")]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(flaky.broker.payloads().len(), 30, "an idle relay waits");
    relay.run_now();
    eventually_async("the panicking round", || *flaky.panicked.lock().unwrap()).await;
    assert!(!relay.is_finished(), "the task survived the panic");
    // The panic's round leased the message for 1 s; the relay idles for an
    // hour unless told: run it now until the lease has run out.
    let deadline = Instant::now() + Duration::from_secs(10);
    while flaky.broker.payloads().len() < 31 {
        assert!(
            Instant::now() < deadline,
            "the message after the panic never went out"
        );
        relay.run_now();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(flaky.broker.payloads()[30], "late");
    relay.stop().await.unwrap();
    let rounds = rounds.lock().unwrap();
    assert!(
        rounds.contains(&false),
        "the panic was reported: {rounds:?}"
    );
}

/// The task's listener: the thread's test
/// (`a_listening_relay_thread_wakes_on_commit_and_listens_again_after_a_kill`)
/// on a tokio task over deadpool.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub async fn a_listening_relay_task_wakes_on_commit_and_listens_again_after_a_kill<
    B: ServerBackend,
>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let tag = "outbox-listening-task";
    let broker = Broker::default();
    assert_eq!(
        notify_triggers(&mut conn),
        0,
        "commits notify nobody by default"
    );
    let relay = BackgroundRelay::new(Relay::new())
        .idle_wait(Duration::from_secs(3600))
        .wake_on_commit(db.tagged_url(tag))
        .spawn_task(B::deadpool(db.url(), 2), broker.clone(), |_| {});
    let first = listener_pid(&mut conn, tag, None);
    assert_eq!(
        notify_triggers(&mut conn),
        1,
        "the listening relay enabled the commit notifications"
    );
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "first")]);
    eventually_async("the commit's wake-up", || broker.payloads() == ["first"]).await;

    terminate::<B>(&mut conn, first);
    listener_pid(&mut conn, tag, Some(first));
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "second")]);
    eventually_async("the wake-up on the new connection", || {
        broker.payloads() == ["first", "second"]
    })
    .await;
    relay.stop().await.unwrap();
}
