//! What a processed message costs through the inbox, against a hand-written
//! Diesel claim and against no deduplication at all, on each backend the
//! build has (`postgres`, `mysql`, `sqlite`).
//!
//! ```text
//! cargo bench --bench claim --features postgres,mysql
//! ```
//!
//! Three ways to apply one message (a one-row `UPDATE`), each in one
//! transaction on one connection, every delivery a new id:
//!
//! - `inbox`: `run_idempotent`, what `#[idempotent]` expands to: the claim,
//!   the effect, and on PostgreSQL the check that the transaction was not
//!   aborted by a failed statement whose error the body ignored (`SELECT 1`
//!   sent with the `COMMIT`, in the same round trip);
//! - `hand-written`: `conn.transaction(..)` running the same claim statement
//!   and the effect, with a plain `COMMIT`;
//! - `no dedup`: `conn.transaction(..)` running the effect alone.
//!
//! The three alternate in rounds, in a rotating order, so whatever else
//! loads the machine weighs on all of them alike; the figures are medians over the rounds, and the
//! ratios are throughput against `hand-written` and `no dedup` from the same
//! run. It prints figures; it asserts nothing.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_runtime::{ClaimKey, ClaimStatement, HandlerName, InboxBackend, run_idempotent};
use inbox_tests::TestBackend as _;

const ROUNDS: usize = 15;
const PER_ROUND: usize = 200;

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        println!(
            "claim benchmark: run it with `cargo bench --bench claim --features postgres,mysql`"
        );
        return;
    }
    println!(
        "{ROUNDS} rounds x {PER_ROUND} deliveries per way; {} CPUs; median time per delivery, throughput ratios from the same run\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    #[cfg(feature = "postgres")]
    if let Some(db) = inbox_tests::Postgres::open() {
        measure("PostgreSQL", &mut db.connect());
        // Without waiting for the WAL flush at COMMIT, round trips dominate:
        // what the commit check costs shows most here.
        let mut conn = db.connect();
        conn.batch_execute("SET synchronous_commit = off; DROP TABLE bench_account")
            .expect("configure the session");
        measure("PostgreSQL, synchronous_commit = off", &mut conn);
    }
    #[cfg(feature = "mysql")]
    if let Some(db) = inbox_tests::Mysql::open() {
        measure("MariaDB/MySQL", &mut db.connect());
    }
    #[cfg(feature = "sqlite")]
    {
        let db = inbox_tests::Sqlite::open().expect("SQLite is embedded");
        measure("SQLite (file, WAL)", &mut db.connect());
    }
}

fn measure<C>(backend: &str, conn: &mut C)
where
    C: Connection,
    C::Backend: InboxBackend,
{
    conn.batch_execute(
        "CREATE TABLE bench_account (id INTEGER PRIMARY KEY, cents BIGINT NOT NULL);
         INSERT INTO bench_account VALUES (1, 0);",
    )
    .expect("create the account table");
    let handler = HandlerName::new("bench.claim").unwrap();
    let mut next_id = 0_u64;
    let mut new_key = || {
        next_id += 1;
        ClaimKey::new(handler.clone(), &next_id).unwrap()
    };
    let effect = |conn: &mut C| {
        conn.batch_execute("UPDATE bench_account SET cents = cents + 1 WHERE id = 1")
    };

    // Each way's rounds, in the order [inbox, hand-written, no dedup].
    let mut rounds: [Vec<Duration>; 3] = Default::default();
    for round in 0..ROUNDS {
        // Rotate which way goes first, so none always follows another.
        for way in (0..3).map(|offset| (round + offset) % 3) {
            let elapsed = timed(|| {
                for _ in 0..PER_ROUND {
                    match way {
                        0 => run_idempotent(conn, new_key(), |conn| effect(conn)).expect("inbox"),
                        1 => {
                            let key = new_key();
                            conn.transaction(|conn| {
                                ClaimStatement::new(&key).execute(conn)?;
                                effect(conn)
                            })
                            .expect("hand-written claim")
                        }
                        _ => conn.transaction(|conn| effect(conn)).expect("no dedup"),
                    }
                }
            });
            rounds[way].push(elapsed);
        }
    }
    let [mut inbox, mut hand_written, mut no_dedup] = rounds;
    let per_delivery = |rounds: &mut Vec<Duration>| median(rounds) / PER_ROUND as u32;
    let (inbox, hand_written, no_dedup) = (
        per_delivery(&mut inbox),
        per_delivery(&mut hand_written),
        per_delivery(&mut no_dedup),
    );
    let ratio = |baseline: Duration| baseline.as_secs_f64() / inbox.as_secs_f64();
    println!(
        "{backend}: inbox {inbox:.1?}, hand-written {hand_written:.1?}, no dedup {no_dedup:.1?} per delivery; \
         inbox throughput = {:.2}x hand-written, {:.2}x no dedup",
        ratio(hand_written),
        ratio(no_dedup)
    );
}

fn timed(run: impl FnOnce()) -> Duration {
    let started = Instant::now();
    run();
    started.elapsed()
}

fn median(rounds: &mut [Duration]) -> Duration {
    rounds.sort();
    rounds[rounds.len() / 2]
}
