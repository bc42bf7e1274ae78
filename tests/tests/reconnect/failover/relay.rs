//! The outbox through a failover (issue 26): a producer records messages
//! through the outbox and a `BackgroundRelay` (a thread over an r2d2 pool)
//! publishes them, both on the pair's multi-host URL, while the primary is
//! killed and, [`NO_WRITABLE_SERVER`] later, the standby promoted. With
//! synchronous replication: every message the producer saw committed is
//! published, none is published that the promoted server does not hold (no
//! ghost), every copy the relay publishes again (its round's record lost
//! with the primary) carries the message's id, and the relay resumes on the
//! promoted server by itself.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_runtime::outbox::{
    self, BackgroundRelay, BlockingPublisher, OutboxMessage, OutgoingMessage, PublishError, Relay,
};
use inbox_tests::Replication;

use super::run::{NO_WRITABLE_SERVER, Pair};

/// Messages the producer records, and how many it has committed when the
/// primary dies.
const MESSAGES: usize = 400;
const FAIL_AT: usize = 150;

/// A broker that confirms every message at once and keeps what it got:
/// `(id, payload)` in publish order.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(String, String)>>>);

impl BlockingPublisher for Recorder {
    fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let mut got = self.0.lock().unwrap();
        for message in messages {
            got.push((
                message.id.to_string(),
                String::from_utf8_lossy(&message.payload).into_owned(),
            ));
        }
        messages.iter().map(|_| Ok(())).collect()
    }
}

impl Recorder {
    fn published(&self) -> Vec<(String, String)> {
        self.0.lock().unwrap().clone()
    }
}

/// Records `payload` in a transaction of its own on `url`, reconnecting
/// when the last connection failed: whether the commit was acknowledged.
fn record(conn: &mut Option<PgConnection>, url: &str, payload: &str) -> bool {
    if conn.is_none() {
        *conn = PgConnection::establish(url).ok();
    }
    let Some(connection) = conn.as_mut() else {
        return false;
    };
    let committed = connection.transaction(|conn| {
        outbox::send(conn, &OutgoingMessage::new("receipts", payload))?;
        Ok::<_, inbox_runtime::InboxError>(())
    });
    if committed.is_err() {
        *conn = None;
    }
    committed.is_ok()
}

/// Every outbox row on `url`: its id and payload, and whether it was sent.
fn rows(url: &str) -> BTreeMap<String, (String, bool)> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        id: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        payload: String,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        sent: bool,
    }
    let mut conn = PgConnection::establish(url).expect("connect to the promoted server");
    diesel::sql_query(
        "SELECT id::text AS id, convert_from(payload, 'UTF8') AS payload, \
         sent_at IS NOT NULL AS sent FROM inbox_outbox",
    )
    .load::<Row>(&mut conn)
    .expect("read the outbox")
    .into_iter()
    .map(|row| (row.id, (row.payload, row.sent)))
    .collect()
}

#[test]
fn a_relay_publishes_every_committed_message_through_a_failover() {
    let Some(pair) = Pair::start(Replication::Synchronous) else {
        return;
    };
    let promoted = pair.standby.url();
    let broker = Recorder::default();
    let pool = Pool::builder()
        .max_size(2)
        .connection_timeout(Duration::from_secs(1))
        .build_unchecked(ConnectionManager::<PgConnection>::new(pair.url.clone()));
    let relay = BackgroundRelay::new(Relay::new().keep_sent(true).lease(Duration::from_secs(2)))
        .idle_wait(Duration::from_millis(10))
        .checkout_timeout(Duration::from_secs(1))
        .backoff(inbox_runtime::Backoff {
            first: Duration::from_millis(20),
            max: Duration::from_millis(200),
        })
        .spawn(pool, broker.clone(), |_| {})
        .unwrap();

    let mut committed = BTreeSet::new();
    let mut conn = None;
    let mut promoted_at = None;
    let mut published_before = 0;
    for n in 0..MESSAGES {
        if n == FAIL_AT {
            // The relay at work on the primary when it dies.
            let deadline = Instant::now() + Duration::from_secs(20);
            while broker.published().is_empty() {
                assert!(
                    Instant::now() < deadline,
                    "the relay published nothing on the primary"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            published_before = broker.published().len();
            pair.primary.stop_immediate();
            std::thread::sleep(NO_WRITABLE_SERVER);
            pair.standby.promote();
            promoted_at = Some(Instant::now());
        }
        let payload = format!("receipt {n}");
        // After the failover a message is recorded again until a commit is
        // acknowledged; a commit that failed may still have happened (its
        // row is then published too, under an id of its own).
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut acknowledged = record(&mut conn, &pair.url, &payload);
        while !acknowledged && n >= FAIL_AT {
            assert!(
                Instant::now() < deadline,
                "no writable server for {payload}"
            );
            std::thread::sleep(Duration::from_millis(20));
            acknowledged = record(&mut conn, &pair.url, &payload);
        }
        if acknowledged {
            committed.insert(payload);
        }
    }
    let promoted_at = promoted_at.expect("the failover happened");

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut check = PgConnection::establish(&promoted).expect("connect to the promoted server");
        let backlog = outbox::backlog(&mut check).unwrap();
        if backlog.pending == 0 && backlog.dead == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not drain the promoted server: {backlog:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    relay.stop().unwrap();

    let held = rows(&promoted);
    let published = broker.published();
    let published_ids: BTreeSet<&String> = published.iter().map(|(id, _)| id).collect();
    let held_payloads: BTreeSet<&String> = held.values().map(|(payload, _)| payload).collect();
    let lost: Vec<&String> = committed
        .iter()
        .filter(|payload| !held_payloads.contains(payload))
        .collect();
    assert!(
        lost.is_empty(),
        "committed, then gone with the primary: {lost:?}"
    );
    let ghosts: Vec<&(String, String)> = published
        .iter()
        .filter(|(id, payload)| held.get(id).is_none_or(|(held, _)| held != payload))
        .collect();
    assert!(
        ghosts.is_empty(),
        "published, yet not on the promoted server: {ghosts:?}"
    );
    let unpublished: Vec<&String> = held
        .keys()
        .filter(|id| !published_ids.contains(id))
        .collect();
    assert!(unpublished.is_empty(), "never published: {unpublished:?}");
    assert!(held.values().all(|(_, sent)| *sent), "all marked sent");
    let republished = published.len() - published_ids.len();
    println!(
        "failover relay: {} messages committed as acknowledged, {} held by the promoted server, \
         {} copies published ({published_before} before the kill, {republished} published again \
         under the same id), drained {:?} after the promotion",
        committed.len(),
        held.len(),
        published.len(),
        promoted_at.elapsed()
    );
}
