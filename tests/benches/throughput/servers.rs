//! The server backends (PostgreSQL, MariaDB/MySQL): their blocking
//! configurations, the round-trip pass through the proxy, and the async
//! configurations (`nonblocking.rs`).

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_tests::TestBackend;

use crate::connections::BenchConnection;
use crate::proxy::Proxy;
use crate::{Config, RoundTrips, Variant, Worker, print_table, rounds, slice_sync, title};

/// Deliveries measured per variant in the round-trip pass.
pub fn counted_deliveries(variant: Variant) -> usize {
    (200 / variant.size()).clamp(2, 20)
}

/// What the bench needs of a server backend.
pub trait Server: inbox_tests::ServerBackend<Connection: BenchConnection> {
    #[cfg(feature = "async")]
    type Async: crate::connections::AsyncBenchConnection;
}

#[cfg(feature = "postgres")]
impl Server for inbox_tests::Postgres {
    #[cfg(feature = "async")]
    type Async = diesel_async::AsyncPgConnection;
}

#[cfg(feature = "mysql")]
impl Server for inbox_tests::Mysql {
    #[cfg(feature = "async")]
    type Async = diesel_async::AsyncMysqlConnection;
}

/// What every connection of the run sends first.
pub fn session_sql<B: TestBackend>(config: &Config) -> Option<&'static str> {
    (B::NAME == "postgres" && config.pg_synchronous_commit_off)
        .then_some("SET synchronous_commit = off")
}

pub fn server<B: Server>(name: &str, config: &Config) {
    let Some(db) = B::open() else {
        println!("\n{name}: skipped (not reachable)");
        return;
    };
    let name = match session_sql::<B>(config) {
        Some(sql) => format!("{name} ({sql})"),
        None => name.to_owned(),
    };
    // The throughput rounds' server: through the network proxy, if any.
    let network = (!config.network_delay.is_zero()).then(|| {
        Proxy::delaying_in_front_of(db.url(), B::DEFAULT_PORT, config.network_delay)
            .expect("start the network proxy")
    });
    let (name, url) = match &network {
        Some((_, proxied)) => (
            format!(
                "{name}, {} µs network delay each way",
                config.network_delay.as_micros()
            ),
            proxied.clone(),
        ),
        None => (name, db.url().to_owned()),
    };
    let most = config.connections.iter().copied().max().unwrap_or(1);
    db.connect()
        .batch_execute(&crate::connections::accounts_sql(most))
        .expect("create the accounts");
    let connect = || {
        let mut conn = B::Connection::establish(&url).expect("connect");
        if let Some(sql) = session_sql::<B>(config) {
            conn.batch_execute(sql).expect("configure the session");
        }
        conn
    };
    let proxy = if config.round_trips {
        checked_proxy::<B>(&name, db.url())
    } else {
        None
    };
    if config.runs("sync") {
        let sync_variants = &config.sync_variants();
        let trips = proxy.as_ref().map(|(proxy, url)| {
            let mut conn = B::Connection::establish(url).expect("connect through the proxy");
            if let Some(sql) = session_sql::<B>(config) {
                conn.batch_execute(sql).expect("configure the session");
            }
            let mut worker = Worker::new(conn, 0);
            let mut trips = RoundTrips::new();
            for &variant in sync_variants {
                worker.deliver(variant);
                worker.deliver(variant);
                let deliveries = counted_deliveries(variant);
                let before = proxy.flights();
                for _ in 0..deliveries {
                    worker.deliver(variant);
                }
                let flights = (proxy.flights() - before) as f64;
                trips.insert(
                    variant,
                    (
                        flights / deliveries as f64,
                        flights / (deliveries * variant.size()) as f64,
                    ),
                );
            }
            trips
        });
        for &connections in &config.connections {
            let mut workers: Vec<_> = (0..connections)
                .map(|account| Worker::new(connect(), account as i64))
                .collect();
            let mut measured = rounds(config, sync_variants, |variant, length| {
                slice_sync(&mut workers, variant, length)
            });
            print_table(
                &title(&name, "sync", connections),
                &mut measured,
                if connections == 1 {
                    trips.as_ref()
                } else {
                    None
                },
            );
        }
    }
    if config.runs("async") {
        #[cfg(feature = "async")]
        crate::nonblocking::run::<B>(&name, config, &url, proxy.as_ref());
        #[cfg(not(feature = "async"))]
        println!("\n{name}, async: not in this build (add `--features async`)");
    }
}

/// A round-trip counting proxy in front of `url`'s server and `url`
/// through it, once the counter measured a known case right.
fn checked_proxy<B: Server>(name: &str, url: &str) -> Option<(Proxy, String)> {
    let (proxy, proxied) = match Proxy::in_front_of(url, B::DEFAULT_PORT) {
        Ok(proxy) => proxy,
        Err(error) => {
            println!("\n{name}: no round trips (the proxy did not start: {error})");
            return None;
        }
    };
    let mut conn = B::Connection::establish(&proxied).expect("connect through the proxy");
    conn.select_one().expect("SELECT 1");
    let mut count = |statements: usize| {
        let before = proxy.flights();
        for _ in 0..statements {
            conn.select_one().expect("SELECT 1");
        }
        proxy.flights() - before
    };
    let (one, three) = (count(1), count(3));
    if (one, three) == (1, 3) {
        let before = proxy.flights();
        conn.batch_execute("SELECT 1").expect("SELECT 1");
        println!(
            "\n{name}: round-trip counter checked: a cached `SELECT 1` = {one} round trip, 3 of them = {three} \
             (and `batch_execute(\"SELECT 1\")`, as Diesel sends `BEGIN` and `COMMIT`: {})",
            proxy.flights() - before
        );
        Some((proxy, proxied))
    } else {
        println!(
            "\n{name}: round trips left out: the counter measured {one} for a cached `SELECT 1` and {three} for 3 of them (expected 1 and 3)"
        );
        None
    }
}
