//! What PgBouncer costs a delivery: the same handler (the claim and one
//! `UPDATE`) on a connection straight to a throwaway PostgreSQL server, and
//! on connections through throwaway PgBouncers in front of it, interleaved
//! slice by slice in one run (the order rotates every round):
//!
//! - `direct`: Diesel's defaults, the baseline;
//! - `direct, cache off`: the statement cache off, what transaction pooling
//!   needs, without PgBouncer;
//! - `transaction pooling, cache off`;
//! - `session pooling`: Diesel's defaults.
//!
//! Each on one connection, one delivery at a time, so a ratio is the cost of
//! a delivery's round trips and statements, not of concurrency. It prints
//! each configuration's throughput against `direct` (the median of the
//! per-round ratios, and their range) and its p50/p99 per delivery; it
//! asserts nothing.
//!
//! Run: `cargo bench -p inbox-tests --bench pgbouncer --features postgres`
//! (`INBOX_BENCH_ROUNDS`, default 8; `INBOX_BENCH_SLICE`, deliveries per
//! configuration and round, default 400).

use std::time::{Duration, Instant};

use diesel::connection::{CacheSize, SimpleConnection as _};
use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent};
use inbox_test_servers::{PgBouncer, PgServer, PoolMode};

struct Payment {
    id: String,
}

#[idempotent(id = msg.id, handler = "bench.pgbouncer")]
fn apply(conn: &mut PgConnection, msg: &Payment) -> QueryResult<Outcome<()>> {
    diesel::sql_query("UPDATE accounts SET balance = balance + 1 WHERE id = 1").execute(conn)?;
    Ok(Outcome::Processed(()))
}

/// One configuration: its name and its connection.
struct Configuration {
    name: &'static str,
    conn: PgConnection,
    /// Per round: deliveries per second.
    rates: Vec<f64>,
    /// Every delivery's time.
    latencies: Vec<Duration>,
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn connect(url: &str, cache: CacheSize) -> PgConnection {
    let mut conn = PgConnection::establish(url).expect("connect");
    conn.set_prepared_statement_cache_size(cache);
    conn
}

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        println!(
            "PgBouncer benchmark: run it with `cargo bench -p inbox-tests --bench pgbouncer --features postgres`"
        );
        return;
    }
    let rounds = env_number("INBOX_BENCH_ROUNDS", 8);
    let slice = env_number("INBOX_BENCH_SLICE", 400);
    let server = PgServer::start().expect("a throwaway PostgreSQL server");
    let mut setup = PgConnection::establish(&server.url()).expect("connect");
    inbox_runtime::setup(&mut setup).expect("the inbox's schema");
    setup
        .batch_execute(
            "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL); \
             INSERT INTO accounts VALUES (1, 0)",
        )
        .expect("the accounts");
    let transaction = PgBouncer::start(&server, PoolMode::Transaction, 4).expect("PgBouncer");
    let session = PgBouncer::start(&server, PoolMode::Session, 4).expect("PgBouncer");

    let mut configurations = [
        ("direct", server.url(), CacheSize::Unbounded),
        ("direct, cache off", server.url(), CacheSize::Disabled),
        (
            "transaction pooling, cache off",
            transaction.url_of("postgres"),
            CacheSize::Disabled,
        ),
        (
            "session pooling",
            session.url_of("postgres"),
            CacheSize::Unbounded,
        ),
    ]
    .map(|(name, url, cache)| Configuration {
        name,
        conn: connect(&url, cache),
        rates: Vec::new(),
        latencies: Vec::new(),
    });

    let mut next = 0u64;
    // A warm-up slice each (statement caches, the pools' server connections).
    for configuration in &mut configurations {
        for _ in 0..50 {
            next += 1;
            let payment = Payment {
                id: format!("warm-{next}"),
            };
            let outcome = apply(&mut configuration.conn, &payment).expect("a delivery");
            assert_eq!(outcome, Outcome::Processed(()));
        }
    }
    for round in 0..rounds {
        let count = configurations.len();
        for offset in 0..count {
            let configuration = &mut configurations[(round + offset) % count];
            let started = Instant::now();
            for _ in 0..slice {
                next += 1;
                let payment = Payment {
                    id: format!("p-{next}"),
                };
                let one = Instant::now();
                let outcome = apply(&mut configuration.conn, &payment).expect("a delivery");
                configuration.latencies.push(one.elapsed());
                assert_eq!(outcome, Outcome::Processed(()));
            }
            let rate = slice as f64 / started.elapsed().as_secs_f64();
            configuration.rates.push(rate);
        }
    }

    println!(
        "\nPgBouncer: {rounds} rounds of {slice} deliveries per configuration, one connection each, \
         load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split(' ')
            .next()
            .unwrap_or("?")
    );
    println!("| configuration | ÷ direct (median, range) | deliveries/s | p50 | p99 |");
    println!("|---|---|---|---|---|");
    let baseline = configurations[0].rates.clone();
    for configuration in &mut configurations {
        let mut ratios: Vec<f64> = configuration
            .rates
            .iter()
            .zip(&baseline)
            .map(|(rate, base)| rate / base)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let mut rates = configuration.rates.clone();
        rates.sort_by(f64::total_cmp);
        configuration.latencies.sort();
        let at = |q: f64| {
            let latencies = &configuration.latencies;
            latencies[((latencies.len() - 1) as f64 * q) as usize]
        };
        println!(
            "| {} | {:.2} ({:.2}–{:.2}) | {:.0} | {:.2} ms | {:.2} ms |",
            configuration.name,
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
            rates[rates.len() / 2],
            at(0.50).as_secs_f64() * 1000.0,
            at(0.99).as_secs_f64() * 1000.0,
        );
    }
}
