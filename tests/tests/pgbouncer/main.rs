//! Behind PgBouncer: a throwaway PostgreSQL server of the test's own with a
//! throwaway PgBouncer in front of it (`inbox_tests::PgServer::pgbouncer`,
//! Debian's `pgbouncer`, 1.18 on Debian 12), in transaction and in session
//! pooling.
//!
//! - Transaction pooling hands each transaction whichever server connection
//!   is free, and PgBouncer before 1.21 does not carry prepared statements
//!   over: with Diesel's statement cache on (its default), a connection's
//!   cached statements are missing on the next server connection, or taken
//!   there by another client's statement of the same name. The delivery
//!   says `Reconnect` and leaves the connection broken (a pool replaces
//!   it); nothing is applied twice.
//! - With the statement cache off
//!   (`set_prepared_statement_cache_size(CacheSize::Disabled)`), every
//!   delivery works through transaction pooling: copies racing on several
//!   connections, the outbox relay, async handlers.
//! - Session pooling keeps a server connection per client: Diesel's
//!   defaults work.
//! - `operations` and `maintenance`: batches, a poison message's attempts
//!   and dead letter, pruning, and the generation layout's maintenance,
//!   behind a PgBouncer that moves a client's consecutive transactions from
//!   one server connection to the next (round robin).
//!
//! Run: `cargo test -p inbox-tests --all-features --test pgbouncer -- --nocapture`
#![cfg(feature = "postgres")]
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;

use diesel::connection::{CacheSize, SimpleConnection as _};
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::sql_types::Text;
use inbox_runtime::outbox::{
    self, BlockingPublisher, OutboxMessage, OutgoingMessage, PublishError,
};
use inbox_runtime::{Outcome, Recovery, idempotent, recovery};
use inbox_test_servers::PgBouncer;
use inbox_tests::{NoStatementCache, PgServer, PoolMode, SqlRows as _};

/// A message of the tests' handler.
struct Message {
    id: String,
    /// Also sends an outgoing message, through the outbox.
    sends: bool,
}

impl Message {
    fn new(id: impl Into<String>) -> Self {
        Message {
            id: id.into(),
            sends: false,
        }
    }
}

/// One effect row per processed message (no key: a second one would show).
#[idempotent(id = msg.id, handler = "pgbouncer.apply")]
fn apply(conn: &mut PgConnection, msg: &Message) -> Result<Outcome<()>, diesel::result::Error> {
    diesel::sql_query("INSERT INTO effects (id) VALUES ($1)")
        .bind::<Text, _>(&msg.id)
        .execute(conn)?;
    if msg.sends {
        outbox::send(conn, &OutgoingMessage::new("receipts", msg.id.clone()))
            .map_err(diesel::result::Error::from)?;
    }
    Ok(Outcome::Processed(()))
}

/// A server with the inbox, the outbox and the effects table, and PgBouncer
/// in front of it.
fn behind(mode: PoolMode, pool_size: u32) -> Option<(PgServer, PgBouncer)> {
    let server = PgServer::start()?;
    let mut direct = PgConnection::establish(&server.url()).expect("connect directly");
    inbox_runtime::setup(&mut direct).expect("the inbox's schema");
    direct
        .batch_execute("CREATE TABLE effects (id TEXT NOT NULL)")
        .expect("the effects table");
    let bouncer = server.pgbouncer(mode, pool_size)?;
    Some((server, bouncer))
}

/// The server and, in front of it, a PgBouncer in transaction pooling that
/// spreads each client's transactions over two server connections, both
/// open (round robin).
fn spread() -> Option<(PgServer, PgBouncer)> {
    let (server, _) = behind(PoolMode::Transaction, 1)?;
    let bouncer = PgBouncer::start_round_robin(&server, PoolMode::Transaction, 2)
        .expect("PgBouncer, round robin");
    open_server_connections(&bouncer, 2);
    Some((server, bouncer))
}

/// Opens `count` server connections behind `bouncer` (each client holds a
/// transaction open at once) and leaves them idle.
fn open_server_connections(bouncer: &PgBouncer, count: usize) {
    let mut clients: Vec<PgConnection> = (0..count)
        .map(|_| through(bouncer, CacheSize::Disabled))
        .collect();
    for client in &mut clients {
        client
            .batch_execute("BEGIN; SELECT 1")
            .expect("pin a server connection");
    }
    for client in &mut clients {
        client.batch_execute("COMMIT").expect("release it");
    }
}

/// A connection through `bouncer`, with Diesel's statement cache as `cache`.
fn through(bouncer: &PgBouncer, cache: CacheSize) -> PgConnection {
    let mut conn =
        PgConnection::establish(&bouncer.url_of("postgres")).expect("connect through PgBouncer");
    conn.set_prepared_statement_cache_size(cache);
    conn
}

/// How many effect rows each id has, read on the server directly.
fn effects(server: &PgServer) -> BTreeMap<String, i64> {
    let mut conn = PgConnection::establish(&server.url()).expect("connect directly");
    let mut counts = BTreeMap::new();
    for id in conn.texts("SELECT id AS value FROM effects") {
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

/// Diesel's defaults through transaction pooling: the second client's
/// first prepared statement takes the name the first client's already
/// holds on the one server connection. The delivery says `Reconnect`, and
/// the connection is left broken: its next delivery fails at once with a
/// `Reconnect` too (a pool would have replaced it), nothing half-applied.
#[test]
fn transaction_pooling_with_the_statement_cache_says_reconnect_and_breaks_the_connection() {
    let Some((server, bouncer)) = behind(PoolMode::Transaction, 1) else {
        return;
    };
    let mut first = through(&bouncer, CacheSize::Unbounded);
    let mut second = through(&bouncer, CacheSize::Unbounded);
    assert_eq!(
        apply(&mut first, &Message::new("t-1")).unwrap(),
        Outcome::Processed(())
    );
    let error =
        apply(&mut second, &Message::new("t-2")).expect_err("the statement's name is taken");
    println!("transaction pooling, statement cache on: {error}");
    assert!(error.to_string().contains("prepared statement"), "{error}");
    assert_eq!(recovery(&error), Recovery::Reconnect, "{error}");
    let again = apply(&mut second, &Message::new("t-2")).expect_err("the connection is broken");
    assert_eq!(recovery(&again), Recovery::Reconnect, "{again}");

    let mut replacement = through(&bouncer, CacheSize::Disabled);
    assert_eq!(
        apply(&mut replacement, &Message::new("t-2")).unwrap(),
        Outcome::Processed(())
    );
    let counts = effects(&server);
    assert_eq!(counts.get("t-1"), Some(&1));
    assert_eq!(counts.get("t-2"), Some(&1));
}

/// Without the statement cache, transaction pooling carries every
/// delivery: each id delivered by eight threads at once through an r2d2
/// pool of eight (more clients than PgBouncer's three server connections)
/// is processed once, and every other copy is a duplicate; no delivery
/// fails.
#[test]
fn transaction_pooling_without_the_statement_cache_processes_every_id_once() {
    let Some((server, bouncer)) = behind(PoolMode::Transaction, 3) else {
        return;
    };
    let pool = Pool::builder()
        .max_size(8)
        .connection_customizer(Box::new(NoStatementCache))
        .build(ConnectionManager::<PgConnection>::new(
            bouncer.url_of("postgres"),
        ))
        .expect("an r2d2 pool through PgBouncer");
    let ids: Arc<Vec<String>> = Arc::new((0..300).map(|n| format!("race-{n}")).collect());
    let failures = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let pool = pool.clone();
            let ids = Arc::clone(&ids);
            let failures = Arc::clone(&failures);
            thread::spawn(move || {
                let mut processed = 0;
                // Each worker starts at another place: the copies race.
                for n in 0..ids.len() {
                    let id = &ids[(n + worker * 37) % ids.len()];
                    let mut conn = pool.get().expect("a pooled connection");
                    match apply(&mut conn, &Message::new(id.as_str())) {
                        Ok(Outcome::Processed(())) => processed += 1,
                        Ok(Outcome::Duplicate) => {}
                        Err(error) => failures.lock().unwrap().push(format!("{id}: {error}")),
                    }
                }
                processed
            })
        })
        .collect();
    let processed: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert_eq!(processed, ids.len(), "each id processed once in all");
    let counts = effects(&server);
    assert_eq!(counts.len(), ids.len());
    assert!(
        counts.values().all(|count| *count == 1),
        "an effect applied twice"
    );
}

/// Session pooling keeps one server connection per client session: Diesel's
/// defaults work, statement cache on.
#[test]
fn session_pooling_works_with_the_statement_cache_on() {
    let Some((server, bouncer)) = behind(PoolMode::Session, 4) else {
        return;
    };
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let mut conn = through(&bouncer, CacheSize::Unbounded);
            thread::spawn(move || {
                let mut processed = 0;
                for n in 0..100 {
                    // Two workers deliver each id.
                    let id = format!("session-{}", (n + worker * 50) % 200);
                    if apply(&mut conn, &Message::new(id)).expect("a delivery")
                        == Outcome::Processed(())
                    {
                        processed += 1;
                    }
                }
                processed
            })
        })
        .collect();
    let processed: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(processed, 200, "each id processed once in all");
    let counts = effects(&server);
    assert_eq!(counts.len(), 200);
    assert!(counts.values().all(|count| *count == 1));
}

/// Collects what the relay publishes.
#[derive(Default)]
struct Collect(Vec<OutboxMessage>);

impl BlockingPublisher for Collect {
    fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        self.0.extend(messages.iter().cloned());
        messages.iter().map(|_| Ok(())).collect()
    }
}

/// The outbox through transaction pooling, statement cache off: handlers
/// record their outgoing messages, and a relay on another connection
/// through PgBouncer publishes each once and deletes it. (Its wake-up on
/// commit, `LISTEN`, is session state, which transaction pooling does not
/// keep: a relay behind it finds the messages by polling.)
#[test]
fn the_outbox_and_its_relay_work_through_transaction_pooling_without_the_statement_cache() {
    let Some((server, bouncer)) = behind(PoolMode::Transaction, 2) else {
        return;
    };
    let mut handler = through(&bouncer, CacheSize::Disabled);
    for n in 0..40 {
        let message = Message {
            id: format!("send-{n}"),
            sends: true,
        };
        assert_eq!(
            apply(&mut handler, &message).expect("a delivery that sends"),
            Outcome::Processed(())
        );
    }
    let mut relay_conn = through(&bouncer, CacheSize::Disabled);
    let mut published = Collect::default();
    let relay = outbox::Relay::new().batch_size(16);
    for _ in 0..10 {
        if relay
            .run_once(&mut relay_conn, &mut published)
            .unwrap()
            .is_idle()
        {
            break;
        }
    }
    let mut payloads: Vec<String> = published
        .0
        .iter()
        .map(|m| String::from_utf8(m.payload.clone()).unwrap())
        .collect();
    payloads.sort();
    let mut expected: Vec<String> = (0..40).map(|n| format!("send-{n}")).collect();
    expected.sort();
    assert_eq!(payloads, expected, "each once");
    let mut direct = PgConnection::establish(&server.url()).unwrap();
    assert_eq!(
        direct.bigint("SELECT COUNT(*) AS value FROM inbox_outbox"),
        0
    );
}

mod maintenance;
mod operations;

#[cfg(feature = "async")]
mod asynchronous {
    use diesel::connection::CacheSize;
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    use inbox_runtime::{Outcome, idempotent};

    use super::*;

    #[idempotent(id = msg.id, handler = "pgbouncer.apply_async")]
    async fn apply_async(
        conn: &mut AsyncPgConnection,
        msg: &Message,
    ) -> Result<Outcome<()>, diesel::result::Error> {
        diesel::sql_query("INSERT INTO effects (id) VALUES ($1)")
            .bind::<Text, _>(&msg.id)
            .execute(conn)
            .await?;
        Ok(Outcome::Processed(()))
    }

    /// Async handlers through transaction pooling, diesel-async's
    /// statement cache off: every id processed once by two connections.
    #[test]
    fn async_handlers_work_through_transaction_pooling_without_the_statement_cache() {
        let Some((server, bouncer)) = behind(PoolMode::Transaction, 2) else {
            return;
        };
        inbox_tests::runtime::multi_thread(2).block_on(async {
            let mut connections = Vec::new();
            for _ in 0..2 {
                // `establish` itself can meet "prepared statement sN does
                // not exist" here (its setup statements run before the
                // cache can be turned off; the guide's PgBouncer chapter):
                // retried, as the guide says.
                let url = bouncer.url_of("postgres");
                let mut tries = 0;
                let mut conn = loop {
                    tries += 1;
                    match AsyncPgConnection::establish(&url).await {
                        Ok(conn) => break conn,
                        Err(error) if tries < 10 => eprintln!("establish, try {tries}: {error}"),
                        Err(error) => panic!("connect through PgBouncer: {error}"),
                    }
                };
                conn.set_prepared_statement_cache_size(CacheSize::Disabled);
                connections.push(conn);
            }
            let mut processed = 0;
            for n in 0..50 {
                for conn in &mut connections {
                    let outcome = apply_async(conn, &Message::new(format!("async-{n}")))
                        .await
                        .expect("a delivery");
                    if outcome == Outcome::Processed(()) {
                        processed += 1;
                    }
                }
            }
            assert_eq!(processed, 50, "each id processed once in all");
        });
        let counts = effects(&server);
        assert_eq!(counts.len(), 50);
        assert!(counts.values().all(|count| *count == 1));
    }
}
