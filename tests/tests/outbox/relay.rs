//! Relaying committed messages: once, in key order, with failures counted
//! where they should be and nothing lost.

use std::collections::{BTreeMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use diesel::Connection;
use inbox_runtime::outbox::{
    self, BlockingPublisher, OutboxMessage, OutgoingMessage, PublishError, Relay,
};
use inbox_runtime::{Backoff, InboxError};
use inbox_tests::{SqlRows, TestBackend};

use crate::support::*;

inbox_tests::backend_tests! {
    publishes_committed_messages_once_and_deletes_them,
    a_relay_that_keeps_sent_messages_marks_them,
    one_message_per_key_and_round_in_key_order,
    a_refused_message_is_retried_then_dead_holding_back_its_key_only,
    an_unavailable_broker_gets_the_messages_back_uncounted,
    a_relay_killed_mid_round_leaves_its_lease_then_another_publishes_the_same_ids,
    three_relays_publish_every_message_once_each_key_in_order,
    three_relays_on_a_flaky_broker_publish_every_message_once_each_key_in_order,
    a_round_puts_back_what_the_broker_did_not_confirm_as_it_was,
    a_relay_refuses_to_run_inside_a_transaction,
    a_message_continues_the_trace_it_was_sent_from,
    a_handlers_messages_continue_its_deliverys_trace;
    only [postgres]:
    a_killed_relay_connection_gives_its_messages_back_at_once,
    a_round_stuck_past_its_lease_loses_its_messages_to_another_relay;
    only [mysql]:
    a_record_that_loses_a_lock_conflict_is_tried_again_not_published_twice;
}

/// No wait before a refused message's retry.
const AT_ONCE: Backoff = Backoff {
    first: Duration::ZERO,
    max: Duration::ZERO,
};

/// Runs rounds until one finds nothing.
fn drain<C: diesel::connection::LoadConnection>(relay: &Relay, conn: &mut C, broker: &mut Broker)
where
    C::Backend: inbox_runtime::InboxBackend,
{
    for _ in 0..1000 {
        if relay.run_once(conn, broker).unwrap().is_idle() {
            return;
        }
    }
    panic!("the relay never ran dry");
}

pub fn publishes_committed_messages_once_and_deletes_them<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let messages: Vec<OutgoingMessage> = (0..5)
        .map(|n| {
            OutgoingMessage::new("receipts", format!("r-{n}"))
                .header("traceparent", format!("00-{n}"))
                .header("kind", "receipt")
        })
        .collect();
    let ids = send_all(&mut conn, &messages);
    let mut broker = Broker::default();
    let report = Relay::new().run_once(&mut conn, &mut broker).unwrap();
    assert_eq!((report.leased, report.published), (5, 5), "{report:?}");
    assert!(
        Relay::new()
            .run_once(&mut conn, &mut broker)
            .unwrap()
            .is_idle()
    );
    let confirmed = broker.confirmed.lock().unwrap().clone();
    assert_eq!(
        confirmed.iter().map(|m| m.id.clone()).collect::<Vec<_>>(),
        ids
    );
    assert_eq!(confirmed[3].payload, b"r-3");
    assert_eq!(
        confirmed[3].headers,
        [
            ("traceparent".to_owned(), "00-3".to_owned()),
            ("kind".to_owned(), "receipt".to_owned())
        ]
    );
    assert_eq!(confirmed[3].destination, "receipts");
    assert_eq!(confirmed[3].attempts, 0);
    assert_eq!(rows(&mut conn), 0, "a confirmed message is deleted");
    assert_eq!(outbox::backlog(&mut conn).unwrap().pending, 0);
}

pub fn a_relay_that_keeps_sent_messages_marks_them<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let messages: Vec<OutgoingMessage> = (0..5)
        .map(|n| OutgoingMessage::new("receipts", format!("r-{n}")))
        .collect();
    let ids = send_all(&mut conn, &messages);
    let relay = Relay::new().keep_sent(true);
    let mut broker = Broker::default();
    let report = relay.run_once(&mut conn, &mut broker).unwrap();
    assert_eq!((report.leased, report.published), (5, 5), "{report:?}");
    assert!(relay.run_once(&mut conn, &mut broker).unwrap().is_idle());
    assert_eq!(broker.payloads().len(), 5, "each published once");
    assert_eq!((rows(&mut conn), sent(&mut conn)), (5, 5));
    let listed: Vec<String> = ids.iter().map(|id| format!("'{id}'")).collect();
    assert_eq!(
        conn.bigint(&format!(
            "SELECT COUNT(*) AS value FROM inbox_outbox WHERE sent_at IS NOT NULL AND id IN ({})",
            listed.join(", ")
        )),
        5,
        "each kept under its id"
    );
    assert_eq!(outbox::backlog(&mut conn).unwrap().pending, 0);
    assert_eq!(
        conn.bigint("SELECT COUNT(*) AS value FROM inbox_outbox WHERE lease_owner IS NOT NULL"),
        0
    );
}

pub fn one_message_per_key_and_round_in_key_order<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    send_all(
        &mut conn,
        &[keyed("a", "a1"), keyed("b", "b1"), keyed("a", "a2")],
    );
    send_all(
        &mut conn,
        &[
            OutgoingMessage::new("receipts", "u1"),
            keyed("a", "a3"),
            keyed("b", "b2"),
            OutgoingMessage::new("receipts", "u2"),
        ],
    );
    let relay = Relay::new();
    let mut broker = Broker::default();
    let mut rounds = Vec::new();
    loop {
        let before = broker.payloads().len();
        if relay.run_once(&mut conn, &mut broker).unwrap().is_idle() {
            break;
        }
        rounds.push(broker.payloads()[before..].to_vec());
    }
    assert_eq!(
        rounds,
        [vec!["a1", "b1", "u1", "u2"], vec!["a2", "b2"], vec!["a3"]]
    );
}

pub fn a_refused_message_is_retried_then_dead_holding_back_its_key_only<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    send_all(
        &mut conn,
        &[
            OutgoingMessage::new("nowhere", "k1").ordering_key("k"),
            keyed("k", "k2"),
            keyed("other", "o1"),
        ],
    );
    let relay = Relay::new().max_attempts(2).backoff(AT_ONCE);
    let mut broker = Broker {
        refuse_destination: Some("nowhere"),
        ..Broker::default()
    };
    let first = relay.run_once(&mut conn, &mut broker).unwrap();
    assert_eq!(
        (first.published, first.refused, first.dead),
        (1, 1, 0),
        "{first:?}"
    );
    let second = relay.run_once(&mut conn, &mut broker).unwrap();
    assert_eq!(
        (second.published, second.refused, second.dead),
        (0, 1, 1),
        "{second:?}"
    );
    assert!(relay.run_once(&mut conn, &mut broker).unwrap().is_idle());
    assert_eq!(broker.payloads(), ["o1"], "k2 waits behind the dead k1");

    let backlog = outbox::backlog(&mut conn).unwrap();
    assert_eq!((backlog.pending, backlog.dead), (1, 1));
    let dead = outbox::dead(&mut conn, 0, 10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].destination, "nowhere");
    assert_eq!(dead[0].ordering_key.as_deref(), Some("k"));
    assert_eq!(dead[0].attempts, 2);
    assert_eq!(dead[0].last_error, "NO_ROUTE nowhere");
    assert!(dead[0].dead_micros >= dead[0].created_micros);
    assert!(
        outbox::dead(&mut conn, dead[0].position, 10)
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        outbox::dead(&mut conn, 0, 0),
        Err(InboxError::InvalidBatchSize { .. })
    ));

    // The broker is fixed: revived, k1 then k2 go out in order.
    broker.refuse_destination = None;
    assert_eq!(outbox::revive(&mut conn, Some(&dead[0].id)).unwrap(), 1);
    let revived = relay.run_once(&mut conn, &mut broker).unwrap();
    assert_eq!(revived.published, 1);
    assert_eq!(
        broker.confirmed.lock().unwrap()[1].attempts,
        0,
        "attempts reset"
    );
    drain(&relay, &mut conn, &mut broker);
    assert_eq!(broker.payloads(), ["o1", "k1", "k2"]);

    // Discarded instead: the key's next message goes out.
    send_all(
        &mut conn,
        &[
            OutgoingMessage::new("nowhere", "k3").ordering_key("k"),
            keyed("k", "k4"),
        ],
    );
    broker.refuse_destination = Some("nowhere");
    let relay = Relay::new().max_attempts(1).backoff(AT_ONCE);
    assert_eq!(relay.run_once(&mut conn, &mut broker).unwrap().dead, 1);
    assert_eq!(outbox::discard(&mut conn, None).unwrap(), 1);
    drain(&relay, &mut conn, &mut broker);
    assert_eq!(broker.payloads(), ["o1", "k1", "k2", "k4"]);
    assert_eq!(outbox::backlog(&mut conn).unwrap().dead, 0);
}

pub fn an_unavailable_broker_gets_the_messages_back_uncounted<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    send_all(
        &mut conn,
        &[
            keyed("k", "k1"),
            keyed("k", "k2"),
            OutgoingMessage::new("q", "u"),
        ],
    );
    let relay = Relay::new().max_attempts(1);
    let mut broker = Broker {
        unavailable: true,
        ..Broker::default()
    };
    for _ in 0..3 {
        let report = relay.run_once(&mut conn, &mut broker).unwrap();
        assert_eq!(
            (report.leased, report.unavailable, report.refused),
            (2, 2, 0)
        );
        assert_eq!(
            report.last_unavailable.as_deref(),
            Some("connection refused")
        );
    }
    assert_eq!(
        conn.bigint("SELECT COALESCE(SUM(attempts), 0) AS value FROM inbox_outbox"),
        0,
        "nothing counted"
    );
    assert_eq!(outbox::backlog(&mut conn).unwrap().pending, 3);
    broker.unavailable = false;
    drain(&relay, &mut conn, &mut broker);
    assert_eq!(broker.payloads(), ["k1", "u", "k2"]);
}

/// Publishes, then dies before the relay can record anything (a relay
/// killed between the broker's confirm and the mark, as far as the
/// database can tell).
struct DiesAfterPublishing(Broker);

impl BlockingPublisher for DiesAfterPublishing {
    fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        self.0.answer(messages);
        panic!("deliberate: the relay is killed after publishing")
    }
}

pub fn a_relay_killed_mid_round_leaves_its_lease_then_another_publishes_the_same_ids<
    B: TestBackend,
>() {
    let Some(db) = B::open() else { return };
    inbox_tests::quiet_deliberate_panics();
    let mut conn = db.connect();
    let ids = send_all(&mut conn, &[keyed("k", "k1"), keyed("k", "k2")]);
    let relay = Relay::new().lease(Duration::from_secs(1));
    let mut dying = DiesAfterPublishing(Broker::default());
    let mut killed = db.connect();
    assert!(catch_unwind(AssertUnwindSafe(|| relay.run_once(&mut killed, &mut dying))).is_err());
    drop(killed);
    assert_eq!(dying.0.payloads(), ["k1"]);

    let mut broker = Broker::default();
    if rounds_hold_locks::<B>() {
        // The round's transaction ended with it: k1 is pending again at once.
        assert_eq!(outbox::backlog(&mut conn).unwrap().pending, 2);
    } else {
        assert!(
            relay.run_once(&mut conn, &mut broker).unwrap().is_idle(),
            "k1 is leased, and k2 waits behind it"
        );
        thread::sleep(Duration::from_millis(1500));
    }
    drain(&relay, &mut conn, &mut broker);
    assert_eq!(broker.payloads(), ["k1", "k2"], "k1 again, same order");
    let confirmed = broker.confirmed.lock().unwrap();
    assert_eq!(
        confirmed[0].id, ids[0],
        "the same id, for the consumer to absorb"
    );
    assert_eq!(confirmed[0].id, dying.0.confirmed.lock().unwrap()[0].id);
    assert_eq!(rows(&mut conn), 0);
}

/// Publishes, then waits for `release` before the relay records anything:
/// a relay stuck between the broker's confirm and the mark.
struct StuckAfterPublishing {
    broker: Broker,
    published: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
}

impl BlockingPublisher for StuckAfterPublishing {
    fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let answers = self.broker.answer(messages);
        self.published.send(()).unwrap();
        self.release.recv().unwrap();
        answers
    }
}

/// Starts a relay round on its own connection that publishes `k1`, then
/// sticks until the returned sender speaks; returns once `k1` is published.
fn stuck_round<B: TestBackend>(
    db: &B,
    relay: Relay,
) -> (
    Broker,
    std::sync::mpsc::Sender<()>,
    thread::JoinHandle<Result<outbox::RelayReport, InboxError>>,
) {
    let (published, on_published) = std::sync::mpsc::channel();
    let (release, on_release) = std::sync::mpsc::channel();
    let broker = Broker::default();
    let mut stuck = StuckAfterPublishing {
        broker: broker.clone(),
        published,
        release: on_release,
    };
    let mut conn = db.connect();
    let round = thread::spawn(move || relay.run_once(&mut conn, &mut stuck));
    on_published.recv().unwrap();
    (broker, release, round)
}

/// PostgreSQL: a round's lease is its transaction's row locks. While the
/// round runs, another relay skips its messages (and the key's later ones);
/// when its connection is killed, the messages are pending at once, not
/// after the lease.
pub fn a_killed_relay_connection_gives_its_messages_back_at_once<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let ids = send_all(&mut conn, &[keyed("k", "k1"), keyed("k", "k2")]);
    let relay = Relay::new().lease(Duration::from_secs(60)).batch_size(1);
    let (stuck, release, round) = stuck_round::<B>(&db, relay.clone());
    let mut broker = Broker::default();
    assert!(
        relay.run_once(&mut conn, &mut broker).unwrap().is_idle(),
        "k1 is locked by the stuck round, and k2 waits behind it"
    );
    // The stuck round's session: the one holding a lock on this test's
    // outbox table (other suites' sessions share the database). Without a
    // timeout `pg_terminate_backend` only sends the signal; with one it
    // returns once the session has ended and its locks are gone.
    let killed = conn.bigint(
        "SELECT COUNT(*) AS value FROM (SELECT DISTINCT pid FROM pg_locks \
         WHERE relation = 'inbox_outbox'::regclass AND pid <> pg_backend_pid()) AS holders \
         WHERE pg_terminate_backend(pid, 5000)",
    );
    assert_eq!(killed, 1, "the stuck round's session");
    drain(&relay, &mut conn, &mut broker);
    assert_eq!(broker.payloads(), ["k1", "k2"], "k1 again, then k2");
    assert_eq!(broker.confirmed.lock().unwrap()[0].id, ids[0]);
    release.send(()).unwrap();
    let error = round.join().unwrap().unwrap_err();
    assert!(matches!(error, InboxError::Database(_)), "{error:?}");
    assert_eq!(stuck.payloads(), ["k1"]);
    assert_eq!(rows(&mut conn), 0);
}

/// PostgreSQL: a round stuck for longer than its lease loses its locks
/// (the server ends its session), so another relay publishes the messages;
/// the stuck round then fails without recording anything.
pub fn a_round_stuck_past_its_lease_loses_its_messages_to_another_relay<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let ids = send_all(&mut conn, &[OutgoingMessage::new("receipts", "m1")]);
    let relay = Relay::new().lease(Duration::from_millis(500));
    let (stuck, release, round) = stuck_round::<B>(&db, relay.clone());
    let mut broker = Broker::default();
    assert!(relay.run_once(&mut conn, &mut broker).unwrap().is_idle());
    thread::sleep(Duration::from_millis(1200));
    drain(&relay, &mut conn, &mut broker);
    assert_eq!(broker.payloads(), ["m1"], "published again after the lease");
    assert_eq!(broker.confirmed.lock().unwrap()[0].id, ids[0]);
    release.send(()).unwrap();
    let error = round.join().unwrap().unwrap_err();
    assert!(matches!(error, InboxError::Database(_)), "{error:?}");
    assert_eq!(stuck.payloads(), ["m1"]);
    assert_eq!(rows(&mut conn), 0);
}

pub fn three_relays_publish_every_message_once_each_key_in_order<B: TestBackend>() {
    three_relays_publish_once::<B>(Broker::default());
}

/// The same with every third message the broker answers unavailable: each
/// round confirms some of its messages and puts the others back (on
/// PostgreSQL, inserted again in the round's transaction), while the other
/// relays lease around them. No message goes out twice, none is lost, and
/// a key's messages go out in commit order.
pub fn three_relays_on_a_flaky_broker_publish_every_message_once_each_key_in_order<
    B: TestBackend,
>() {
    three_relays_publish_once::<B>(Broker {
        flaky_every: 3,
        ..Broker::default()
    });
}

/// 8 keys of 25 messages and 25 unkeyed ones, relayed by three relays
/// publishing to `broker` (and its clones) in rounds of 5 until the outbox
/// is empty: each message confirmed once, each key's in commit order.
fn three_relays_publish_once<B: TestBackend>(broker: Broker) {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    const KEYS: usize = 8;
    const PER_KEY: usize = 25;
    for wave in 0..PER_KEY {
        let mut messages: Vec<OutgoingMessage> = (0..KEYS)
            .map(|key| keyed(&format!("key-{key}"), &format!("key-{key}:{wave}")))
            .collect();
        messages.push(OutgoingMessage::new("receipts", format!("free:{wave}")));
        send_all(&mut conn, &messages);
    }
    let start = Arc::new(Barrier::new(3));
    let relays: Vec<_> = (0..3)
        .map(|_| {
            let mut conn = db.connect();
            let mut broker = broker.clone();
            let start = Arc::clone(&start);
            thread::spawn(move || {
                let relay = Relay::new().batch_size(5);
                start.wait();
                let mut idle = 0;
                while idle < 3 {
                    let report = relay.run_once(&mut conn, &mut broker).unwrap();
                    idle = if report.is_idle() { idle + 1 } else { 0 };
                    if report.is_idle() {
                        thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect();
    for relay in relays {
        relay.join().unwrap();
    }
    let payloads = broker.payloads();
    assert_eq!(payloads.len(), KEYS * PER_KEY + PER_KEY);
    let distinct: HashSet<&String> = payloads.iter().collect();
    assert_eq!(distinct.len(), payloads.len(), "no message published twice");
    let mut per_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for payload in &payloads {
        let (key, wave) = payload.split_once(':').unwrap();
        if key != "free" {
            per_key.entry(key).or_default().push(wave.parse().unwrap());
        }
    }
    for (key, waves) in per_key {
        assert_eq!(
            waves,
            (0..PER_KEY).collect::<Vec<_>>(),
            "{key} in commit order"
        );
    }
    assert_eq!(outbox::backlog(&mut conn).unwrap().pending, 0);
}

/// Every column of the outbox's rows, one text per row in position order.
fn outbox_rows<C: SqlRows>(conn: &mut C, backend: &str) -> Vec<String> {
    const COLUMNS: [&str; 15] = [
        "position",
        "id",
        "destination",
        "ordering_key",
        "key_seq",
        "headers",
        "payload",
        "created_at",
        "attempts",
        "last_error",
        "retry_at",
        "lease_owner",
        "leased_until",
        "sent_at",
        "dead_at",
    ];
    let each = |format: fn(&str) -> String, separator: &str| COLUMNS.map(format).join(separator);
    let value = match backend {
        "postgres" => format!("ROW({})::text", COLUMNS.join(", ")),
        "mysql" => format!(
            "CONCAT_WS('|', {})",
            each(|column| format!("IFNULL(HEX({column}), 'NULL')"), ", ")
        ),
        _ => each(|column| format!("quote({column})"), " || '|' || "),
    };
    conn.texts(&format!(
        "SELECT {value} AS value FROM inbox_outbox ORDER BY position"
    ))
}

/// A round whose broker confirms one message, refuses one and cannot take
/// one: the confirmed one is gone; the unavailable one is back exactly as
/// it was (every column: position, id, key, headers, payload, creation
/// time, attempts, and the error and next try of an earlier refusal); the
/// refused one likewise, but for its attempt counted, its new error and
/// next try. The next round publishes both with
/// the ids, headers and payloads they were sent with.
pub fn a_round_puts_back_what_the_broker_did_not_confirm_as_it_was<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    send_all(
        &mut conn,
        &[
            keyed("k", "k1"),
            OutgoingMessage::new("nowhere", "k2")
                .ordering_key("k")
                .header("h", "v"),
            OutgoingMessage::new("later", "c").header("x-a", "1"),
        ],
    );
    let relay = Relay::new().max_attempts(5).backoff(AT_ONCE);
    // k1 goes out (k2 waits behind it); c is refused once: an error to keep.
    let mut broker = Broker {
        refuse_destination: Some("later"),
        ..Broker::default()
    };
    let first = relay.run_once(&mut conn, &mut broker).unwrap();
    assert_eq!((first.published, first.refused), (1, 1), "{first:?}");
    let before = outbox_rows(&mut conn, B::NAME);
    assert_eq!(before.len(), 2, "{before:?}");

    send_all(&mut conn, &[OutgoingMessage::new("receipts", "e")]);
    let mut broker = Broker {
        refuse_destination: Some("nowhere"),
        unavailable_destination: Some("later"),
        confirmed: broker.confirmed,
        ..Broker::default()
    };
    let second = relay.run_once(&mut conn, &mut broker).unwrap();
    assert_eq!(
        (
            second.leased,
            second.published,
            second.refused,
            second.unavailable
        ),
        (3, 1, 1, 1),
        "{second:?}"
    );
    let after = outbox_rows(&mut conn, B::NAME);
    assert_eq!(after.len(), 2, "e is gone, k2 and c are back: {after:?}");
    let (k2, c) = (&after[0], &after[1]);
    assert_eq!(c, &before[1], "c is back as it was");
    assert_ne!(k2, &before[0], "k2's refusal is counted");

    let mut broker = Broker {
        confirmed: broker.confirmed,
        ..Broker::default()
    };
    drain(&relay, &mut conn, &mut broker);
    assert_eq!(broker.payloads(), ["k1", "e", "k2", "c"]);
    let confirmed = broker.confirmed.lock().unwrap();
    let (k2, c) = (&confirmed[2], &confirmed[3]);
    assert_eq!((k2.attempts, c.attempts), (1, 1));
    assert_eq!(k2.ordering_key.as_deref(), Some("k"));
    assert!(
        k2.headers.contains(&("h".to_owned(), "v".to_owned())),
        "{:?}",
        k2.headers
    );
    assert!(
        c.headers.contains(&("x-a".to_owned(), "1".to_owned())),
        "{:?}",
        c.headers
    );
    assert!(outbox::backlog(&mut conn).unwrap().pending == 0);
}

/// The schema the connection's outbox is in.
#[cfg(feature = "postgres")]
fn current_schema(conn: &mut diesel::PgConnection) -> String {
    conn.texts("SELECT current_schema()::text AS value")
        .remove(0)
}

/// Notifications of commits on `listener`'s channel `inbox_outbox` from
/// `schema`'s outbox, after a moment for them to arrive.
#[cfg(feature = "postgres")]
fn notifications(listener: &mut diesel::PgConnection, schema: &str) -> usize {
    use diesel::connection::SimpleConnection as _;
    thread::sleep(Duration::from_millis(300));
    listener.batch_execute("SELECT 1").unwrap();
    listener
        .notifications_iter()
        .map(Result::unwrap)
        .filter(|notification| notification.channel == "inbox_outbox")
        .filter(|notification| notification.payload == schema)
        .count()
}

/// With commit notifications on, a relay round that puts back what the
/// broker did not confirm commits an insert, but nothing new: it notifies
/// no relay, while a transaction that records a message does. The
/// notifying function of an earlier version (which notified on every
/// insert) is replaced when notifications are enabled again.
#[cfg(feature = "postgres")]
#[test]
fn postgres_a_put_back_notifies_no_relay_even_where_an_earlier_trigger_did() {
    use diesel::connection::SimpleConnection as _;
    let Some(db) = inbox_tests::Postgres::open() else {
        return;
    };
    let mut conn = db.connect();
    let schema = current_schema(&mut conn);
    // The earlier version's function and trigger.
    conn.batch_execute(
        "CREATE FUNCTION inbox_outbox_notify() RETURNS trigger LANGUAGE plpgsql \
         SET search_path = pg_catalog, pg_temp AS $body$ BEGIN \
         PERFORM pg_notify('inbox_outbox', TG_TABLE_SCHEMA); RETURN NULL; END $body$; \
         CREATE TRIGGER inbox_outbox_notify AFTER INSERT ON inbox_outbox \
         FOR EACH STATEMENT EXECUTE FUNCTION inbox_outbox_notify();",
    )
    .unwrap();
    outbox::enable_commit_notifications(&mut conn).unwrap();
    let mut listener = db.connect();
    listener.batch_execute("LISTEN inbox_outbox").unwrap();

    send_all(
        &mut conn,
        &[
            OutgoingMessage::new("receipts", "a"),
            OutgoingMessage::new("later", "b"),
        ],
    );
    assert_eq!(
        notifications(&mut listener, &schema),
        1,
        "a recorded message"
    );
    let mut broker = Broker {
        unavailable_destination: Some("later"),
        ..Broker::default()
    };
    let round = Relay::new().run_once(&mut conn, &mut broker).unwrap();
    assert_eq!((round.published, round.unavailable), (1, 1), "{round:?}");
    assert_eq!(
        conn.bigint("SELECT count(*) AS value FROM inbox_outbox"),
        1,
        "b is back"
    );
    assert_eq!(notifications(&mut listener, &schema), 0, "a put-back");
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "c")]);
    assert_eq!(
        notifications(&mut listener, &schema),
        1,
        "a recorded message"
    );
    outbox::disable_commit_notifications(&mut conn).unwrap();
}

/// A relay whose role may not insert into the outbox cannot put back what
/// the broker did not confirm: that round fails and is rolled back (its
/// confirmed message published again later, under its id), and the relay
/// holds its rows locked from then on, deleting what the broker confirmed.
/// Nothing is lost; the relay's clones remember it too.
#[cfg(feature = "postgres")]
#[test]
fn postgres_a_relay_whose_role_may_not_put_back_holds_its_rows_locked_instead() {
    use diesel::connection::SimpleConnection as _;
    let Some(db) = inbox_tests::Postgres::open() else {
        return;
    };
    let mut conn = db.connect();
    let schema = current_schema(&mut conn);
    let role = format!("{schema}_relay");
    conn.batch_execute(&format!(
        "CREATE ROLE \"{role}\" NOLOGIN; \
         GRANT USAGE ON SCHEMA \"{schema}\" TO \"{role}\"; \
         GRANT SELECT, UPDATE, DELETE ON inbox_outbox TO \"{role}\";"
    ))
    .unwrap();
    let mut relay_conn = db.connect();
    relay_conn
        .batch_execute(&format!("SET ROLE \"{role}\""))
        .unwrap();
    let checked = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let ids = send_all(
            &mut conn,
            &[
                OutgoingMessage::new("receipts", "a"),
                OutgoingMessage::new("later", "b"),
            ],
        );
        let relay = Relay::new();
        let mut broker = Broker {
            unavailable_destination: Some("later"),
            ..Broker::default()
        };
        let refused = relay.run_once(&mut relay_conn, &mut broker);
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(
            conn.bigint("SELECT count(*) AS value FROM inbox_outbox"),
            2,
            "rolled back: both pending"
        );
        let clone = relay.clone();
        let round = clone.run_once(&mut relay_conn, &mut broker).unwrap();
        assert_eq!((round.published, round.unavailable), (1, 1), "{round:?}");
        broker.unavailable_destination = None;
        drain(&relay, &mut relay_conn, &mut broker);
        assert_eq!(broker.payloads(), ["a", "a", "b"], "a published again");
        let confirmed = broker.confirmed.lock().unwrap();
        assert_eq!(confirmed[0].id, confirmed[1].id, "under its id");
        assert_eq!(confirmed[0].id, ids[0]);
        assert_eq!(outbox::backlog(&mut conn).unwrap().pending, 0);
    }));
    relay_conn.batch_execute("RESET ROLE").unwrap();
    conn.batch_execute(&format!(
        "REVOKE ALL ON inbox_outbox FROM \"{role}\"; \
         REVOKE ALL ON SCHEMA \"{schema}\" FROM \"{role}\"; DROP ROLE \"{role}\";"
    ))
    .unwrap();
    if let Err(panic) = checked {
        std::panic::resume_unwind(panic);
    }
}

pub fn a_message_continues_the_trace_it_was_sent_from<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let ids = send_all(
        &mut conn,
        &[
            OutgoingMessage::new("receipts", "a")
                .header("traceparent", "00-stale")
                .header("kind", "receipt")
                .continue_trace(incoming),
            OutgoingMessage::new("receipts", "b").continue_trace(incoming),
            OutgoingMessage::new("receipts", "c")
                .header("traceparent", "kept as given")
                .continue_trace("not a traceparent"),
        ],
    );
    let mut broker = Broker::default();
    drain(&Relay::new(), &mut conn, &mut broker);
    let confirmed = broker.confirmed.lock().unwrap().clone();
    let traceparents: Vec<Vec<&str>> = confirmed
        .iter()
        .map(|m| {
            m.headers
                .iter()
                .filter(|(name, _)| name == "traceparent")
                .map(|(_, value)| value.as_str())
                .collect()
        })
        .collect();
    let span = |id: &outbox::OutboxId| {
        let digits: String = id.as_str().chars().filter(|c| *c != '-').collect();
        digits[digits.len() - 16..].to_owned()
    };
    assert_eq!(
        traceparents[0],
        [format!(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01",
            span(&ids[0])
        )]
    );
    assert_eq!(
        traceparents[1],
        [format!(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01",
            span(&ids[1])
        )]
    );
    assert_ne!(traceparents[0], traceparents[1], "a span per message");
    assert_eq!(
        traceparents[2],
        ["kept as given"],
        "an invalid trace adds nothing"
    );
    assert_eq!(
        confirmed[0].headers[0],
        ("kind".to_owned(), "receipt".to_owned())
    );
}

/// Sends two messages: one naming no trace, one with a `traceparent` of
/// its own.
#[inbox_runtime::idempotent(id = id, handler = "outbox.traced", trace = traceparent)]
fn traced<C>(conn: &mut C, id: &str, traceparent: Option<&str>) -> Result<(), inbox_tests::AppError>
where
    C: diesel::connection::LoadConnection + diesel::r2d2::R2D2Connection,
    C::Backend: inbox_runtime::InboxBackend,
{
    outbox::send(
        conn,
        &OutgoingMessage::new("receipts", format!("{id} plain")),
    )?;
    let own = OutgoingMessage::new("receipts", format!("{id} own")).header("traceparent", "given");
    outbox::send(conn, &own)?;
    Ok(())
}

/// `#[idempotent(trace = …)]`: what its body sends continues the incoming
/// trace, unless it names one of its own; a delivery without the header,
/// and the code after a traced delivery, continue none.
pub fn a_handlers_messages_continue_its_deliverys_trace<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    traced(&mut conn, "t-1", Some(INCOMING_TRACE)).unwrap();
    traced(&mut conn, "t-2", None).unwrap();
    send_all(&mut conn, &[OutgoingMessage::new("receipts", "after")]);
    let mut broker = Broker::default();
    drain(&Relay::new(), &mut conn, &mut broker);
    let traceparents = traceparents(&broker);
    assert!(
        continues_incoming(&traceparents["t-1 plain"]),
        "{traceparents:?}"
    );
    assert_eq!(traceparents["t-1 own"], ["given"]);
    assert!(traceparents["t-2 plain"].is_empty(), "{traceparents:?}");
    assert!(traceparents["after"].is_empty(), "{traceparents:?}");
}

pub fn a_relay_refuses_to_run_inside_a_transaction<B: TestBackend>() {
    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    send_all(&mut conn, &[OutgoingMessage::new("q", "x")]);
    let mut broker = Broker::default();
    let result: Result<(), InboxError> = conn.transaction(|conn| {
        let error = Relay::new().run_once(conn, &mut broker).unwrap_err();
        assert!(
            matches!(error, InboxError::InsideTransaction { .. }),
            "{error:?}"
        );
        Ok(())
    });
    result.unwrap();
    assert!(broker.payloads().is_empty());
    assert_eq!(outbox::backlog(&mut conn).unwrap().pending, 1);
}

/// On PostgreSQL, a lease walks the pending messages, not the sent ones
/// before them: with 30,000 sent messages and 2,000 pending, EXPLAIN
/// ANALYZE of a lease of 100 shows no scan that reads rows and filters them
/// out by the thousand (without the pending index the planner walked the
/// primary key through every sent message: a lease of 100 took 4 ms).
#[cfg(feature = "postgres")]
#[test]
fn postgres_lease_walks_the_pending_messages_not_the_sent_ones() {
    use diesel::connection::SimpleConnection;
    let Some(db) = inbox_tests::Postgres::open() else {
        return;
    };
    let mut conn = db.connect();
    conn.batch_execute(
        "INSERT INTO inbox_outbox (id, destination, headers, payload, sent_at) \
         SELECT 'sent-' || g, 'receipts', '\\x00', '\\x00', statement_timestamp() \
         FROM generate_series(1, 30000) g",
    )
    .unwrap();
    let pending: Vec<OutgoingMessage> = (0..2_000)
        .map(|n| OutgoingMessage::new("receipts", format!("m{n}")))
        .collect();
    send_all(&mut conn, &pending);
    conn.batch_execute("ANALYZE inbox_outbox").unwrap();
    #[derive(diesel::QueryableByName)]
    struct PlanLine {
        #[diesel(sql_type = diesel::sql_types::Text)]
        #[diesel(column_name = "QUERY PLAN")]
        line: String,
    }
    // The lease that deletes what it picks, and the one that keeps them.
    for keep_sent in [false, true] {
        let lease = outbox::lease_statement::<diesel::pg::Pg>(keep_sent)
            .expect("one statement on PostgreSQL")
            .replace("$1", "'30000'")
            .replace("$2", "100");
        // EXPLAIN ANALYZE runs the lease: in a transaction rolled back.
        let mut plan = Vec::new();
        let _ = conn.transaction(|conn| {
            plan = diesel::RunQueryDsl::load::<PlanLine>(
                diesel::sql_query(format!("EXPLAIN (ANALYZE, COSTS OFF) {lease}")),
                conn,
            )?
            .into_iter()
            .map(|line| line.line)
            .collect();
            Err::<(), _>(diesel::result::Error::RollbackTransaction)
        });
        let filtered: u64 = plan
            .iter()
            .filter_map(|line| line.trim().strip_prefix("Rows Removed by Filter: "))
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .sum();
        assert!(
            filtered < 1_000,
            "keep_sent {keep_sent}: the lease read and filtered out {filtered} rows:\n{}",
            plan.join("\n")
        );
        assert!(
            plan.iter().any(|line| line.contains("rows=100")),
            "keep_sent {keep_sent}: the lease took its 100:\n{}",
            plan.join("\n")
        );
    }
}

/// MySQL/MariaDB: InnoDB keeps a lock on every row a locking read scanned
/// until its transaction ends (another relay's lease, say), so the record of
/// a confirmed message can wait for another transaction and lose: a lock
/// wait timeout here, a deadlock between relays. The record is tried again
/// (the runtime's one retry policy), not reported as the round's failure,
/// which would leave the published message to be published again once its
/// lease ran out.
pub fn a_record_that_loses_a_lock_conflict_is_tried_again_not_published_twice<B: TestBackend>() {
    use diesel::connection::SimpleConnection as _;

    let Some(db) = B::open() else { return };
    let mut conn = db.connect();
    let ids = send_all(&mut conn, &[OutgoingMessage::new("receipts", "m1")]);
    // The publisher stops after publishing until the blocker holds the lock.
    let (published, on_published) = std::sync::mpsc::channel();
    let (locked, on_locked) = std::sync::mpsc::channel();
    let mut blocker = db.connect();
    let holder = thread::spawn(move || {
        on_published.recv().unwrap();
        blocker
            .transaction::<_, diesel::result::Error, _>(|conn| {
                conn.batch_execute("UPDATE inbox_outbox SET destination = destination")?;
                locked.send(()).unwrap();
                thread::sleep(Duration::from_millis(1500));
                Ok(())
            })
            .unwrap();
    });
    let broker = Broker::default();
    let mut publisher = StuckAfterPublishing {
        broker: broker.clone(),
        published,
        release: on_locked,
    };
    let mut relay_conn = db.connect();
    relay_conn
        .batch_execute("SET SESSION innodb_lock_wait_timeout = 1")
        .unwrap();
    let relay = Relay::new().lease(Duration::from_millis(500));
    let report = relay.run_once(&mut relay_conn, &mut publisher);
    holder.join().unwrap();
    let report = report.expect("the record is tried again after the lock wait");
    assert_eq!((report.leased, report.published), (1, 1), "{report:?}");
    assert_eq!(rows(&mut conn), 0, "deleted as sent");
    thread::sleep(Duration::from_millis(600));
    let mut later = Broker::default();
    assert!(relay.run_once(&mut conn, &mut later).unwrap().is_idle());
    assert_eq!(broker.payloads(), ["m1"]);
    assert_eq!(broker.confirmed.lock().unwrap()[0].id, ids[0]);
    assert!(later.payloads().is_empty(), "published once");
}
