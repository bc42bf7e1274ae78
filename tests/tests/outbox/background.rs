//! The relay on a thread of its own over an r2d2 pool: it drains the
//! backlog in key order, picks up new messages after an idle wait or at
//! once on `run_now`, backs off while the broker is unavailable, survives a
//! panicking publisher, and stops when asked.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inbox_runtime::Backoff;
use inbox_runtime::outbox::{
    self, BackgroundRelay, OutgoingMessage, Relay, RelayRound, RelayRoundError,
};
use inbox_tests::terminate;
use inbox_tests::{ServerBackend, TestBackend};

use crate::support::*;

inbox_tests::backend_tests! {
    a_relay_thread_drains_then_follows_new_commits,
    a_rate_limited_relay_thread_paces_its_rounds_and_run_now_does_not_skip_the_pace,
    a_relay_thread_backs_off_while_the_broker_is_unavailable_and_survives_a_panic;
    only [postgres]:
        a_listening_relay_thread_wakes_on_commit_and_listens_again_after_a_kill,
        a_listening_relay_thread_sleeps_through_another_schemas_commits;
}

pub fn a_relay_thread_drains_then_follows_new_commits<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    send_all(&mut conn, &backlog());
    let broker = Broker::default();
    let rounds = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&rounds);
    let relay = BackgroundRelay::new(Relay::new().batch_size(7))
        .idle_wait(Duration::from_secs(3600))
        .spawn(db.pool(2), broker.clone(), move |round| {
            let idle = matches!(round, RelayRound::Done(report) if report.is_idle());
            seen.lock()
                .unwrap()
                .push((matches!(round, RelayRound::Done(_)), idle));
        })
        .unwrap();
    eventually("the backlog", || broker.payloads().len() == 30);
    // Once a round found nothing, idle for an hour unless told.
    eventually("an idle round", || {
        rounds.lock().unwrap().last().is_some_and(|(_, idle)| *idle)
    });
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "late")]);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(broker.payloads().len(), 30, "an idle relay waits");
    relay.run_now();
    eventually("the round run now", || broker.payloads().len() == 31);
    relay.stop().unwrap();
    assert!(rounds.lock().unwrap().iter().all(|(done, _)| *done));
    assert_keys_in_order(&broker.payloads());
}

pub fn a_rate_limited_relay_thread_paces_its_rounds_and_run_now_does_not_skip_the_pace<
    B: TestBackend,
>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let messages: Vec<OutgoingMessage> = (0..40)
        .map(|n| OutgoingMessage::new("receipts", format!("m{n}")))
        .collect();
    send_all(&mut conn, &messages);
    let broker = Broker::default();
    let started = std::time::Instant::now();
    // 40 messages in rounds of 10 at 50 a second: rounds start 200 ms apart.
    let relay = BackgroundRelay::new(Relay::new().batch_size(10))
        .max_rate(50)
        .idle_wait(Duration::from_secs(3600))
        .spawn(db.pool(2), broker.clone(), |_| {})
        .unwrap();
    for _ in 0..20 {
        relay.run_now();
        std::thread::sleep(Duration::from_millis(10));
    }
    eventually("the backlog", || broker.payloads().len() == 40);
    let took = started.elapsed();
    relay.stop().unwrap();
    assert!(
        took >= Duration::from_millis(600),
        "4 rounds, each at least 200 ms after the one before: {took:?}"
    );
}

pub fn a_relay_thread_backs_off_while_the_broker_is_unavailable_and_survives_a_panic<
    B: TestBackend,
>() {
    let Some(db) = B::open() else { return };
    inbox_tests::quiet_deliberate_panics();
    let mut conn = db.connect();
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "one")]);
    let flaky = Flaky {
        broker: Broker::default(),
        healed: Arc::new(Mutex::new(false)),
        panicked: Arc::new(Mutex::new(false)),
    };
    let rounds = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&rounds);
    let relay = BackgroundRelay::new(Relay::new().lease(Duration::from_secs(1)))
        .idle_wait(Duration::from_millis(20))
        .backoff(Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_millis(400),
        })
        .spawn(db.pool(1), flaky.clone(), move |round| {
            seen.lock().unwrap().push(match round {
                RelayRound::Done(report) if report.unavailable > 0 => "unavailable",
                RelayRound::Done(_) => "done",
                RelayRound::Failed(RelayRoundError::Panicked(_)) => "panicked",
                _ => "failed",
            });
        })
        .unwrap();
    // Asked to run now every 10 ms (as after every commit): the backoff
    // still holds.
    for _ in 0..120 {
        relay.run_now();
        std::thread::sleep(Duration::from_millis(10));
    }
    let unavailable = rounds.lock().unwrap().len();
    // Backing off 100, 200, 400, 400 ms: 4 or 5 rounds in 1.2 s, not
    // hundreds.
    assert!(
        (3..=6).contains(&unavailable),
        "{unavailable} rounds while unavailable"
    );
    *flaky.healed.lock().unwrap() = true;
    // The panic's round leased the message: it goes out once its 1 s lease
    // runs out.
    eventually("the message after the panic", || {
        flaky.broker.payloads() == ["one"]
    });
    assert!(!relay.is_finished(), "the thread survived the panic");
    relay.stop().unwrap();
    let rounds = rounds.lock().unwrap();
    assert!(rounds.contains(&"panicked"), "{rounds:?}");
    assert!(
        rounds[..unavailable].iter().all(|r| *r == "unavailable"),
        "{rounds:?}"
    );
}

/// On PostgreSQL, a relay idling for an hour publishes a message as soon
/// as its transaction commits (the outbox's trigger notifies the relay's
/// listening connection); its listening connection killed, it listens
/// again on a new one and wakes on the next commit.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub fn a_listening_relay_thread_wakes_on_commit_and_listens_again_after_a_kill<B: ServerBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let tag = "outbox-listening-thread";
    let broker = Broker::default();
    assert_eq!(
        notify_triggers(&mut conn),
        0,
        "commits notify nobody by default"
    );
    let relay = BackgroundRelay::new(Relay::new())
        .idle_wait(Duration::from_secs(3600))
        .wake_on_commit(db.tagged_url(tag))
        .spawn(db.pool(2), broker.clone(), |_| {})
        .unwrap();
    let first = listener_pid(&mut conn, tag, None);
    assert_eq!(
        notify_triggers(&mut conn),
        1,
        "the listening relay enabled the commit notifications"
    );
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "first")]);
    eventually("the commit's wake-up", || broker.payloads() == ["first"]);

    terminate::<B>(&mut conn, first);
    listener_pid(&mut conn, tag, Some(first));
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "second")]);
    eventually("the wake-up on the new connection", || {
        broker.payloads() == ["first", "second"]
    });
    relay.stop().unwrap();
}

/// On PostgreSQL, the relays of every schema in a database listen on one
/// channel, and a commit notifies it with its outbox's schema: a relay
/// wakes for its own schema's commits only, not for another's.
#[cfg(feature = "postgres")]
pub fn a_listening_relay_thread_sleeps_through_another_schemas_commits<
    B: ServerBackend<Connection = diesel::PgConnection>,
>() {
    let Some(db) = B::open() else { return };
    let Some(other) = B::open() else { return };
    let mut conn = db.connect();
    let mut other_conn = other.connect();
    outbox::enable_commit_notifications(&mut other_conn).unwrap();
    let tag = "outbox-listening-own-schema";
    let broker = Broker::default();
    let rounds = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&rounds);
    let relay = BackgroundRelay::new(Relay::new())
        .idle_wait(Duration::from_secs(3600))
        .wake_on_commit(db.tagged_url(tag))
        .spawn(db.pool(2), broker.clone(), move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    listener_pid(&mut conn, tag, None);
    eventually("the first round", || rounds.load(Ordering::SeqCst) == 1);
    for n in 0..5 {
        send_all(
            &mut other_conn,
            &[OutgoingMessage::new("receipts", format!("other {n}"))],
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        rounds.load(Ordering::SeqCst),
        1,
        "another schema's commits wake no round"
    );
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "own")]);
    eventually("the own commit's wake-up", || broker.payloads() == ["own"]);
    // The round that published it, then one that found nothing: a relay
    // woken by the other schema's commits would have run more.
    eventually("the idle round after it", || {
        rounds.load(Ordering::SeqCst) >= 3
    });
    relay.stop().unwrap();
    assert_eq!(
        rounds.load(Ordering::SeqCst),
        3,
        "the first, the own commit's, the idle one"
    );
}
