//! What deduplication costs per message: the inbox's ways of delivering a
//! message against hand-written claims and against no deduplication at
//! all, on every backend, blocking and async, on 1 and 8 connections, with
//! the round trips each way sends.
//!
//! ```text
//! cargo bench -p inbox-tests --bench throughput --features postgres,mysql,async
//! INBOX_BENCH_BACKENDS=postgres INBOX_BENCH_VARIANTS=handler,batch-100 cargo bench -p inbox-tests --bench throughput --features postgres
//! tests/benches/bench.sh     # this, then what observability costs (observe.sh)
//! cargo bench -p inbox-tests --bench throughput --features postgres,mysql -- growth
//! ```
//!
//! The last one measures instead how a claim's cost changes as the inbox
//! grows (prefilled to 30 M rows, and across archived generations): see
//! `growth.rs`.
//!
//! # Variants
//!
//! Every message's effect is a one-row `UPDATE` (of the delivering
//! connection's own account row, through Diesel's DSL, which never caches
//! an `UPDATE`'s prepared statement), every delivery a new id unless said
//! otherwise:
//!
//! - `no-dedup`: a transaction with the effect alone: the baseline;
//! - `claim-cached`: hand-written, `conn.transaction(..)` running
//!   [`ClaimStatement`](inbox_runtime::ClaimStatement) (a prepared
//!   statement Diesel caches) and, when it claimed a row, the effect;
//! - `claim-guarded` (async only, not in the default list):
//!   `claim-cached` with the deadlock guard its backend needs, written by
//!   hand: on MariaDB/MySQL, whose deadlock rolls the whole transaction
//!   back and lets a body that swallowed it go on in a new one,
//!   `autocommit` off and a savepoint set before the claim, released before
//!   the commit (`SET SESSION autocommit = 0; SAVEPOINT …`, `RELEASE
//!   SAVEPOINT …; SET SESSION autocommit = 1`), what `handler` does; on
//!   PostgreSQL, whose failed statement aborts the transaction, it is
//!   `claim-cached`;
//! - `guard-none`, `guard-savepoint`, `guard-autocommit`, `guard-both`,
//!   `guard-idle`, `guard-token` (async only, not in the default list):
//!   what each part of MariaDB/MySQL's deadlock guard costs the server,
//!   each the claim sent as the async handler sends it (hex literals, in
//!   one text with the begin) under one guard: none, the savepoint alone,
//!   `autocommit` off alone, both (the handler's guard), both with the
//!   idle bound and the claim's wait bound (the handler's own texts), and
//!   the blocking handler's claim
//!   token checked in the commit (see `guards.rs`); on PostgreSQL they are
//!   `claim-cached`;
//! - `claim-uncached`: the same with the claim as
//!   `diesel::sql_query("INSERT … ON CONFLICT DO NOTHING")` (`INSERT
//!   IGNORE` on MariaDB/MySQL) with two binds, which Diesel never caches;
//! - `handler`: `run_idempotent`, what `#[idempotent]` expands to; async,
//!   an `#[idempotent]` handler written for the connection's own type
//!   (on `AsyncPgConnection` its `BEGIN` travels with the claim);
//! - `duplicate`: a redelivery of an id already claimed, through the same:
//!   the body does not run;
//! - `bulk-N`: `N` messages through `run_idempotent_batch_bulk`: one body
//!   for the new messages of the batch, whose effect is one `UPDATE` adding
//!   their count (what a batch's effects written in one statement cost)
//! - `batch-N`: `N` messages through `run_idempotent_batch`
//!   (`run_idempotent_batch_async`), one transaction per batch;
//! - `fingerprint`, `fingerprint-duplicate`, `stored-result`,
//!   `stored-duplicate`: payload fingerprints and stored results, blocking
//!   connections only (see `payload.rs`; not in the default list).
//!
//! # Configurations
//!
//! PostgreSQL and MariaDB/MySQL (the servers of `INBOX_TEST_POSTGRES_URL`
//! and `INBOX_TEST_MYSQL_URL`, as in the tests; a server that cannot be
//! reached is skipped with a line saying so) and SQLite (a file, WAL,
//! `synchronous = NORMAL`); blocking connections and diesel-async ones
//! (`AsyncPgConnection`, `AsyncMysqlConnection`, on TCP as the blocking
//! ones; feature `async`); 1 and 8 connections, each on a thread or a
//! tokio task of its own (a runtime with one worker per CPU), all
//! delivering distinct ids. SQLite runs blocking on 1 connection only: it
//! has one writer at a time, so more connections wait on its lock (busy
//! waits) instead of working in parallel, and diesel-async's SQLite is the
//! blocking connection run on tokio's blocking pool.
//!
//! # Method
//!
//! Per configuration, after a warm-up slice of every variant, rounds: each
//! round gives every variant a slice of time (`INBOX_BENCH_SLICE_MS`), in
//! an order rotated every round, so whatever drifts (other processes, the
//! inbox table growing, the server's caches) weighs on every variant alike.
//! For each variant it prints the median throughput over the rounds, its
//! ratio to `no-dedup` (the median of the per-round ratios, with their
//! range), and p50 and p99 latency per delivery over every delivery of the
//! rounds; for batches also per message (the batch's time divided by its
//! size: the amortized cost, while each message of a batch waits for the
//! whole batch).
//!
//! Neither criterion nor divan fits: both measure one benchmark to the end
//! before starting the next, so a drift over the minutes of a run (a build
//! starting next to it on this 2-CPU machine, the inbox table growing)
//! lands on whichever variant runs then, and the ratios between variants
//! (what this bench is for) absorb it. Here the variants interleave slice
//! by slice and every ratio is taken within a round.
//!
//! # Round trips
//!
//! For PostgreSQL and MariaDB the bench also counts the round trips of
//! each variant, blocking and async on one connection: a pass through a
//! loopback TCP proxy of its own (`proxy.rs`, a thread per direction) that
//! counts client→server flights: a read from the client socket after the
//! server has sent data starts a new one. The throughput rounds connect
//! directly, without the proxy. At startup the counter is checked on a
//! known case: a `SELECT 1` that Diesel has prepared and cached is one
//! round trip, three of them three (the statement's first execution, which
//! prepares it, is not counted); when the check fails, that server's round
//! trips are left out. (Diesel's `batch_execute` is no such case on
//! MariaDB: it turns multi-statements on and off around the query, three
//! commands.) Round trips per delivery are counted after two warm-up
//! deliveries, so cached statements are already prepared, as in a
//! long-running consumer.
//!
//! # Settings (environment)
//!
//! - `INBOX_BENCH_BACKENDS`: `postgres,mysql,sqlite` (those in the build);
//! - `INBOX_BENCH_MODES`: `sync,async` (`async` needs feature `async`);
//! - `INBOX_BENCH_CONNECTIONS`: `1,8`;
//! - `INBOX_BENCH_VARIANTS`: `no-dedup,claim-cached,claim-uncached,handler,duplicate,batch-1,batch-10,batch-100,batch-1000,bulk-10,bulk-100`
//!   (`no-dedup` always runs: it is the baseline);
//! - `INBOX_BENCH_ROUNDS`: 12; `INBOX_BENCH_SLICE_MS`: 250 (per variant per
//!   round); `INBOX_BENCH_ROUND_TRIPS`: 1 (0 skips the proxy pass);
//! - `INBOX_BENCH_PG_SYNCHRONOUS_COMMIT=off`: PostgreSQL sessions without
//!   waiting for the WAL flush at commit, where round trips weigh most.
//! - `INBOX_BENCH_NETWORK_DELAY_US`: 0; otherwise the throughput rounds of
//!   the servers connect through a loopback proxy (`proxy.rs`) that
//!   forwards every chunk that many microseconds after it arrived, either
//!   way: a network between the service and its database (250: a round trip
//!   costs 0.5 ms more, as within one zone of a cloud region). Every variant
//!   pays it per round trip, the baseline included.
//!
//! The default run takes about 6 minutes with every backend and mode. It
//! prints figures; it asserts nothing.

mod batch;
mod connections;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod growth;
mod guards;
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
mod nonblocking;
mod outbox;
mod payload;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod proxy;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod servers;

use std::collections::BTreeMap;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_runtime::{ClaimKey, ClaimStatement, HandlerName, MessageId, run_idempotent};
use inbox_tests::TestBackend;

use self::connections::BenchConnection;

const HANDLER: &str = "bench.throughput";

/// Ids already claimed per connection, redelivered by `duplicate`.
const REDELIVERED: usize = 100;

/// The next message id: unique across connections, variants and rounds.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn fresh_ids(count: usize) -> u64 {
    NEXT_ID.fetch_add(count as u64, Ordering::Relaxed)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    NoDedup,
    ClaimCached,
    ClaimGuarded,
    Guard(guards::GuardShape),
    ClaimUncached,
    Handler,
    Duplicate,
    Batch(usize),
    Bulk(usize),
    Fingerprint,
    FingerprintDuplicate,
    Outbox,
    OutboxKeyed,
    #[cfg(feature = "serde")]
    Stored,
    #[cfg(feature = "serde")]
    StoredDuplicate,
}

impl Variant {
    fn name(self) -> String {
        match self {
            Variant::NoDedup => "no-dedup".into(),
            Variant::ClaimCached => "claim-cached".into(),
            Variant::ClaimGuarded => "claim-guarded".into(),
            Variant::Guard(shape) => format!("guard-{}", shape.name()),
            Variant::ClaimUncached => "claim-uncached".into(),
            Variant::Handler => "handler".into(),
            Variant::Duplicate => "duplicate".into(),
            Variant::Batch(size) => format!("batch-{size}"),
            Variant::Bulk(size) => format!("bulk-{size}"),
            Variant::Fingerprint => "fingerprint".into(),
            Variant::FingerprintDuplicate => "fingerprint-duplicate".into(),
            Variant::Outbox => "outbox".into(),
            Variant::OutboxKeyed => "outbox-keyed".into(),
            #[cfg(feature = "serde")]
            Variant::Stored => "stored-result".into(),
            #[cfg(feature = "serde")]
            Variant::StoredDuplicate => "stored-duplicate".into(),
        }
    }

    /// Whether this is one of `payload.rs`'s variants (blocking only).
    fn is_payload(self) -> bool {
        match self {
            Variant::Fingerprint | Variant::FingerprintDuplicate => true,
            #[cfg(feature = "serde")]
            Variant::Stored | Variant::StoredDuplicate => true,
            _ => false,
        }
    }

    fn parse(name: &str) -> Option<Variant> {
        Some(match name {
            "no-dedup" => Variant::NoDedup,
            "claim-cached" => Variant::ClaimCached,
            "claim-guarded" => Variant::ClaimGuarded,
            "claim-uncached" => Variant::ClaimUncached,
            "handler" => Variant::Handler,
            "duplicate" => Variant::Duplicate,
            "fingerprint" => Variant::Fingerprint,
            "fingerprint-duplicate" => Variant::FingerprintDuplicate,
            "outbox" => Variant::Outbox,
            "outbox-keyed" => Variant::OutboxKeyed,
            #[cfg(feature = "serde")]
            "stored-result" => Variant::Stored,
            #[cfg(feature = "serde")]
            "stored-duplicate" => Variant::StoredDuplicate,
            _ => {
                let size = |prefix: &str| -> Option<usize> {
                    name.strip_prefix(prefix)?.parse().ok().filter(|&n| n > 0)
                };
                if let Some(shape) = name.strip_prefix("guard-") {
                    return guards::GuardShape::parse(shape).map(Variant::Guard);
                }
                match size("batch-") {
                    Some(n) => Variant::Batch(n),
                    None => Variant::Bulk(size("bulk-")?),
                }
            }
        })
    }

    /// Whether it runs on blocking connections only (`payload.rs`'s
    /// variants).
    #[cfg_attr(not(feature = "async"), allow(dead_code))]
    fn blocking_only(self) -> bool {
        self.is_payload()
    }

    /// Whether it runs on diesel-async connections only (`claim-guarded`,
    /// `guard-*`).
    fn async_only(self) -> bool {
        matches!(self, Variant::ClaimGuarded | Variant::Guard(_))
    }

    /// Messages per delivery.
    fn size(self) -> usize {
        match self {
            Variant::Batch(size) | Variant::Bulk(size) => size,
            _ => 1,
        }
    }
}

// Some settings only matter to the servers.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
struct Config {
    backends: Vec<String>,
    modes: Vec<String>,
    connections: Vec<usize>,
    variants: Vec<Variant>,
    rounds: usize,
    slice: Duration,
    round_trips: bool,
    pg_synchronous_commit_off: bool,
    /// Added to every chunk either way between the throughput rounds'
    /// connections and their server (zero: connected directly).
    network_delay: Duration,
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|item| item.trim().to_owned())
        .filter(|item| !item.is_empty())
        .collect()
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value}: not a number"))
    })
}

impl Config {
    /// The variants blocking connections run.
    fn sync_variants(&self) -> Vec<Variant> {
        let sync = |variant: &&Variant| !variant.async_only();
        self.variants.iter().filter(sync).copied().collect()
    }

    fn from_env() -> Config {
        let mut variants: Vec<Variant> = env_list(
            "INBOX_BENCH_VARIANTS",
            "no-dedup,claim-cached,claim-uncached,handler,duplicate,batch-1,batch-10,batch-100,batch-1000,bulk-10,bulk-100",
        )
        .iter()
        .map(|name| {
            Variant::parse(name).unwrap_or_else(|| panic!("INBOX_BENCH_VARIANTS: no variant `{name}`"))
        })
        .collect();
        variants.push(Variant::NoDedup);
        variants.sort();
        variants.dedup();
        Config {
            backends: env_list("INBOX_BENCH_BACKENDS", "postgres,mysql,sqlite"),
            modes: env_list("INBOX_BENCH_MODES", "sync,async"),
            connections: env_list("INBOX_BENCH_CONNECTIONS", "1,8")
                .iter()
                .map(|n| n.parse().expect("INBOX_BENCH_CONNECTIONS: numbers"))
                .collect(),
            variants,
            rounds: env_number("INBOX_BENCH_ROUNDS", 12) as usize,
            slice: Duration::from_millis(env_number("INBOX_BENCH_SLICE_MS", 250)),
            round_trips: env_number("INBOX_BENCH_ROUND_TRIPS", 1) == 1,
            pg_synchronous_commit_off: std::env::var("INBOX_BENCH_PG_SYNCHRONOUS_COMMIT")
                .is_ok_and(|value| value == "off"),
            network_delay: Duration::from_micros(env_number("INBOX_BENCH_NETWORK_DELAY_US", 0)),
        }
    }

    fn runs(&self, mode: &str) -> bool {
        self.modes.iter().any(|m| m == mode)
    }
}

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        println!(
            "throughput benchmark: run it with `cargo bench -p inbox-tests --bench throughput --features postgres,mysql,async`"
        );
        return;
    }
    let started = Instant::now();
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    if std::env::args().any(|arg| arg == "growth") {
        growth::run();
        println!("\ndone in {:.0} s", started.elapsed().as_secs_f64());
        return;
    }
    let config = Config::from_env();
    println!(
        "{} CPUs, load average {}; {} rounds x {} ms per variant; variants {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average(),
        config.rounds,
        config.slice.as_millis(),
        config
            .variants
            .iter()
            .map(|v| v.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if config.variants.iter().any(|variant| variant.is_payload()) {
        payload::print_hash_cost();
    }
    for backend in &config.backends {
        match backend.as_str() {
            #[cfg(feature = "postgres")]
            "postgres" => servers::server::<inbox_tests::Postgres>("PostgreSQL", &config),
            #[cfg(feature = "mysql")]
            "mysql" => servers::server::<inbox_tests::Mysql>("MariaDB/MySQL", &config),
            #[cfg(feature = "sqlite")]
            "sqlite" => sqlite(&config),
            // The backends this build lacks.
            #[allow(unreachable_patterns)]
            "postgres" | "mysql" | "sqlite" => {
                println!("\n{backend}: not in this build (add `--features {backend}`)")
            }
            other => panic!("INBOX_BENCH_BACKENDS: no backend `{other}`"),
        }
    }
    println!(
        "\ndone in {:.0} s; load average {}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "?".into(),
        |text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        },
    )
}

/// How a worker makes the ids of new messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ids {
    /// A counter shared by every worker, as decimal text: each new id sorts
    /// after most earlier ones, as time-ordered ids do.
    Counter,
    /// Random UUIDs (version 4), as most producers assign them.
    Random,
    /// Time-ordered UUIDs (version 7).
    TimeOrdered,
}

impl Ids {
    fn name(self) -> &'static str {
        match self {
            Ids::Counter => "counter",
            Ids::Random => "random UUIDv4",
            Ids::TimeOrdered => "time-ordered UUIDv7",
        }
    }
}

/// One delivering connection and what it needs.
struct Worker<C> {
    conn: C,
    account: i64,
    handler: HandlerName,
    /// The ids of new messages (`handler`).
    ids: Ids,
    /// Ids this connection claimed, for `duplicate`.
    redeliver: Vec<u64>,
    next_redelivery: usize,
    /// Bodies and ids of the payload variants.
    payloads: payload::Payloads,
}

fn key(handler: &HandlerName, id: impl MessageId) -> ClaimKey {
    ClaimKey::new(handler.clone(), &id).expect("a valid key")
}

impl<C: BenchConnection> Worker<C> {
    fn new(mut conn: C, account: i64) -> Self {
        let handler = HandlerName::new(HANDLER).expect("a valid handler name");
        let first = fresh_ids(REDELIVERED);
        let redeliver: Vec<u64> = (first..first + REDELIVERED as u64).collect();
        for &id in &redeliver {
            run_idempotent(&mut conn, key(&handler, id), |conn: &mut C| {
                conn.effect(account).map(drop)
            })
            .expect("claim an id to redeliver");
        }
        Worker {
            conn,
            account,
            handler,
            ids: Ids::Counter,
            redeliver,
            next_redelivery: 0,
            payloads: payload::Payloads::new(),
        }
    }

    /// One delivery of `variant`.
    fn deliver(&mut self, variant: Variant) {
        let account = self.account;
        let handler = &self.handler;
        match variant {
            Variant::NoDedup => {
                self.conn
                    .transaction(|conn| conn.effect(account))
                    .expect("no-dedup");
            }
            Variant::ClaimGuarded => unreachable!("claim-guarded: async connections only"),
            Variant::Guard(_) => unreachable!("guard-*: async connections only"),
            Variant::ClaimCached => {
                let key = key(handler, fresh_ids(1));
                self.conn
                    .transaction(|conn| {
                        if ClaimStatement::new(&key).execute(conn)? == 1 {
                            conn.effect(account)?;
                        }
                        QueryResult::Ok(())
                    })
                    .expect("claim-cached");
            }
            Variant::ClaimUncached => {
                let id = fresh_ids(1).to_string();
                self.conn
                    .transaction(|conn| {
                        if conn.claim_uncached(handler.as_str(), &id)? == 1 {
                            conn.effect(account)?;
                        }
                        QueryResult::Ok(())
                    })
                    .expect("claim-uncached");
            }
            Variant::Handler => {
                let key = match self.ids {
                    Ids::Counter => key(handler, fresh_ids(1)),
                    Ids::Random => key(handler, uuid::Uuid::new_v4()),
                    Ids::TimeOrdered => key(handler, uuid::Uuid::now_v7()),
                };
                run_idempotent(&mut self.conn, key, |conn: &mut C| {
                    conn.effect(account).map(drop)
                })
                .expect("handler");
            }
            Variant::Duplicate => {
                let id = self.redeliver[self.next_redelivery % self.redeliver.len()];
                self.next_redelivery += 1;
                run_idempotent(
                    &mut self.conn,
                    key(handler, id),
                    |_: &mut C| -> QueryResult<()> {
                        unreachable!("a duplicate's body does not run")
                    },
                )
                .expect("duplicate");
            }
            Variant::Batch(size) => {
                let first = fresh_ids(size);
                let ids: Vec<u64> = (first..first + size as u64).collect();
                batch::deliver(&mut self.conn, handler, &ids, account);
            }
            Variant::Bulk(size) => {
                let first = fresh_ids(size);
                let ids: Vec<u64> = (first..first + size as u64).collect();
                batch::deliver_bulk(&mut self.conn, handler, &ids, account);
            }
            Variant::Outbox | Variant::OutboxKeyed => self.deliver_outbox(variant),
            payload => self.deliver_payload(payload),
        }
    }

    /// Delivers `variant` until `length` has passed.
    fn run(&mut self, variant: Variant, length: Duration) -> Sample {
        let mut sample = Sample::starting();
        let deadline = sample.start + length;
        loop {
            let before = Instant::now();
            self.deliver(variant);
            let after = Instant::now();
            sample.record(before, after, variant.size());
            if after >= deadline {
                return sample;
            }
        }
    }
}

/// The deliveries of one slice, on one or more connections.
struct Sample {
    start: Instant,
    end: Instant,
    messages: usize,
    /// Nanoseconds per delivery.
    latencies: Vec<u64>,
}

impl Sample {
    fn starting() -> Sample {
        let now = Instant::now();
        Sample {
            start: now,
            end: now,
            messages: 0,
            latencies: Vec::new(),
        }
    }

    fn record(&mut self, before: Instant, after: Instant, messages: usize) {
        self.latencies.push((after - before).as_nanos() as u64);
        self.messages += messages;
        self.end = after;
    }

    fn merge(samples: impl IntoIterator<Item = Sample>) -> Sample {
        let mut samples = samples.into_iter();
        let mut total = samples.next().expect("one sample at least");
        for sample in samples {
            total.start = total.start.min(sample.start);
            total.end = total.end.max(sample.end);
            total.messages += sample.messages;
            total.latencies.extend(sample.latencies);
        }
        total
    }

    fn throughput(&self) -> f64 {
        self.messages as f64 / (self.end - self.start).as_secs_f64()
    }
}

/// One slice of `variant` on every worker at once, each on a thread of
/// its own (on the caller's when there is one).
fn slice_sync<C: BenchConnection>(
    workers: &mut [Worker<C>],
    variant: Variant,
    length: Duration,
) -> Sample {
    if let [worker] = workers {
        return worker.run(variant, length);
    }
    let barrier = Barrier::new(workers.len());
    std::thread::scope(|scope| {
        let threads: Vec<_> = workers
            .iter_mut()
            .map(|worker| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    worker.run(variant, length)
                })
            })
            .collect();
        Sample::merge(threads.into_iter().map(|t| t.join().expect("a worker")))
    })
}

/// A variant's figures over the rounds.
struct Measured {
    variant: Variant,
    throughputs: Vec<f64>,
    latencies: Vec<u64>,
}

/// Warms every variant up, then runs the rounds: every variant one slice
/// per round, the order rotated every round.
fn rounds(
    config: &Config,
    variants: &[Variant],
    mut slice: impl FnMut(Variant, Duration) -> Sample,
) -> Vec<Measured> {
    for &variant in variants {
        slice(variant, config.slice / 3);
    }
    let mut measured: Vec<Measured> = variants
        .iter()
        .map(|&variant| Measured {
            variant,
            throughputs: Vec::new(),
            latencies: Vec::new(),
        })
        .collect();
    for round in 0..config.rounds {
        for offset in 0..variants.len() {
            let at = (round + offset) % variants.len();
            let sample = slice(variants[at], config.slice);
            measured[at].throughputs.push(sample.throughput());
            measured[at].latencies.extend(sample.latencies);
        }
    }
    measured
}

/// Round trips per delivery and per message, by variant.
type RoundTrips = BTreeMap<Variant, (f64, f64)>;

fn print_table(title: &str, measured: &mut [Measured], round_trips: Option<&RoundTrips>) {
    println!("\n{title}");
    let baseline = measured
        .iter()
        .find(|m| m.variant == Variant::NoDedup)
        .map(|m| m.throughputs.clone());
    println!(
        "  {:<15} {:>9} {:>19} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "variant",
        "msgs/s",
        "x no-dedup (range)",
        "p50",
        "p99",
        "p50/msg",
        "p99/msg",
        "RT/deliv",
        "RT/msg"
    );
    for m in measured.iter_mut() {
        let throughput = median(&mut m.throughputs.clone());
        let ratio = baseline.as_ref().map_or("-".to_owned(), |baseline| {
            let mut ratios: Vec<f64> = m
                .throughputs
                .iter()
                .zip(baseline)
                .map(|(variant, baseline)| variant / baseline)
                .collect();
            let middle = median(&mut ratios);
            format!(
                "{middle:.2} ({:.2}-{:.2})",
                ratios.first().copied().unwrap_or(f64::NAN),
                ratios.last().copied().unwrap_or(f64::NAN)
            )
        });
        m.latencies.sort_unstable();
        let at = |per_mille: usize| {
            let latencies = &m.latencies;
            latencies
                .get((latencies.len() * per_mille / 1000).min(latencies.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0)
        };
        let (p50, p99) = (at(500), at(990));
        let size = m.variant.size() as u64;
        let per_message = |nanos: u64| {
            if size == 1 {
                "=".to_owned()
            } else {
                duration(nanos / size)
            }
        };
        let (trips, trips_per_message) = round_trips
            .and_then(|trips| trips.get(&m.variant))
            .map_or(("-".to_owned(), "-".to_owned()), |(delivery, message)| {
                (format!("{delivery:.2}"), format!("{message:.3}"))
            });
        println!(
            "  {:<15} {:>9.0} {:>19} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
            m.variant.name(),
            throughput,
            ratio,
            duration(p50),
            duration(p99),
            per_message(p50),
            per_message(p99),
            trips,
            trips_per_message
        );
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn duration(nanos: u64) -> String {
    match nanos {
        0..10_000 => format!("{:.1}µs", nanos as f64 / 1e3),
        10_000..1_000_000 => format!("{:.0}µs", nanos as f64 / 1e3),
        1_000_000..100_000_000 => format!("{:.2}ms", nanos as f64 / 1e6),
        _ => format!("{:.0}ms", nanos as f64 / 1e6),
    }
}

fn title(backend: &str, mode: &str, connections: usize) -> String {
    format!(
        "{backend}, {mode}, {connections} connection{} (load average {})",
        if connections == 1 { "" } else { "s" },
        load_average()
    )
}

#[cfg(feature = "sqlite")]
fn sqlite(config: &Config) {
    let db = inbox_tests::Sqlite::open().expect("SQLite is embedded");
    db.connect()
        .batch_execute(&connections::accounts_sql(1))
        .expect("create the accounts");
    if !config.runs("sync") {
        println!(
            "\nSQLite: blocking only (its async connection is the blocking one on tokio's blocking pool)"
        );
        return;
    }
    if config.connections != [1] {
        println!(
            "\nSQLite: 1 connection only (one writer at a time: more connections wait on its lock)"
        );
    }
    let mut workers = vec![Worker::new(db.connect(), 0)];
    let mut measured = rounds(config, &config.sync_variants(), |variant, length| {
        slice_sync(&mut workers, variant, length)
    });
    print_table(&title("SQLite (file, WAL)", "sync", 1), &mut measured, None);
}
