//! Pruning at scale on PostgreSQL, with live handler traffic.
//!
//! ```text
//! cargo bench --bench prune --features postgres
//! INBOX_BENCH_ROWS=200000 cargo bench --bench prune --features postgres   # a quicker run
//! ```
//!
//! For each pruning method, in one run: fill 1,000,000 expired ids, start
//! live handlers (open loop, a fixed rate of deliveries, each a claim plus
//! one effect row in one transaction), then alternate spans of about a
//! second with and without pruning until everything expired is gone, and
//! compare the handlers' latency in the two kinds of span. Alternating makes
//! whatever else loads the machine weigh on both sides alike.
//!
//! - batched deletes (`Prune`), with and without a pause between batches;
//! - the generation layout: one generation holding the expired ids is
//!   detached and dropped (`partitioned::drop_expired`); also the cost of a
//!   rotation and of the claim trigger.
//!
//! It prints figures; it asserts nothing. The server is
//! `INBOX_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`);
//! everything happens in schemas of its own, dropped at the end.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use inbox_runtime::prune::partitioned;
use inbox_runtime::{ClaimKey, HandlerName, InboxError, Prune, RetentionPolicy, run_idempotent};
use inbox_tests::{Postgres, TestBackend};

/// Deliveries per second, all handlers together.
const RATE: u32 = 400;
const HANDLERS: u32 = 4;

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("prune benchmark: run it with `cargo bench --bench prune --features postgres`");
        return;
    }
    let rows: u64 = std::env::var("INBOX_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let Some(probe) = Postgres::open() else {
        println!("prune benchmark: PostgreSQL is not reachable");
        return;
    };
    let version: Version = diesel::sql_query("SELECT current_setting('server_version') AS version")
        .get_result(&mut probe.connect())
        .unwrap();
    drop(probe);
    println!(
        "PostgreSQL {}, {} CPUs; {rows} expired ids per method; live traffic {RATE} deliveries/s on {HANDLERS} connections \
         (claim + one effect row per transaction)\n",
        version.version,
        thread::available_parallelism().map_or(0, |n| n.get())
    );

    let policy = RetentionPolicy::parse("7d", "1d").unwrap();
    // (rows per batch, pause between batches, stop after this much pruning):
    // the last setting paces pruning at about 5,000 rows/s, five times the
    // insert rate of a 1,000 msg/s service, and is measured over 20 s.
    for (batch, pause, cap) in [
        (5_000, Duration::ZERO, None),
        (5_000, Duration::from_millis(20), None),
        (1_000, Duration::from_millis(5), None),
        (500, Duration::from_millis(10), None),
        (
            500,
            Duration::from_millis(100),
            Some(Duration::from_secs(20)),
        ),
    ] {
        let prune = Prune::new(policy.clone()).batch_size(batch).pause(pause);
        batched(rows, &prune, batch, pause, cap);
    }
    generations(rows, &policy);
    claim_cost();
}

#[derive(QueryableByName)]
struct Version {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}

/// Fills the inbox with `rows` ids received a month ago, then settles the
/// table (vacuum, statistics, checkpoint) so the fill does not weigh on the
/// measurements.
fn fill(conn: &mut PgConnection, rows: u64, prefix: &str) -> Duration {
    let started = Instant::now();
    conn.batch_execute(&format!(
        "INSERT INTO inbox_messages (handler, message_id, received_at) \
         SELECT 'bench.old', '{prefix}-' || g, now() - interval '30 days' + g * interval '1 millisecond' \
         FROM generate_series(1, {rows}) AS g"
    ))
    .unwrap();
    let elapsed = started.elapsed();
    conn.batch_execute("VACUUM ANALYZE inbox_messages").unwrap();
    conn.batch_execute("CHECKPOINT").unwrap();
    elapsed
}

/// One delivery's latency, and when it started.
#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    latency: Duration,
}

/// Live handlers delivering new ids at `RATE` per second until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<(Vec<Sample>, usize)>>,
}

impl Traffic {
    fn start(url: &str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let interval = Duration::from_secs_f64(f64::from(HANDLERS) / f64::from(RATE));
        let threads = (0..HANDLERS)
            .map(|worker| {
                let stop = Arc::clone(&stop);
                let url = url.to_owned();
                thread::spawn(move || {
                    let mut conn = PgConnection::establish(&url).unwrap();
                    let handler = HandlerName::new("bench.live").unwrap();
                    let mut samples = Vec::new();
                    let mut errors = 0;
                    // Stagger the workers across one interval.
                    let mut next = Instant::now() + interval * worker / HANDLERS;
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let now = Instant::now();
                        if next > now {
                            thread::sleep(next - now);
                        }
                        next += interval;
                        let id = format!("live-{worker}-{n}");
                        n += 1;
                        let at = Instant::now();
                        let key = ClaimKey::new(handler.clone(), &id).unwrap();
                        let result = run_idempotent(&mut conn, key, |conn| {
                            diesel::sql_query("INSERT INTO bench_effects (message_id) VALUES ($1)")
                                .bind::<diesel::sql_types::Text, _>(&id)
                                .execute(conn)?;
                            Ok::<_, InboxError>(())
                        });
                        match result {
                            Ok(()) => samples.push(Sample {
                                at,
                                latency: at.elapsed(),
                            }),
                            Err(_) => errors += 1,
                        }
                    }
                    (samples, errors)
                })
            })
            .collect();
        Traffic { stop, threads }
    }

    fn stop(self) -> (Vec<Sample>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        let mut errors = 0;
        for thread in self.threads {
            let (samples, failed) = thread.join().unwrap();
            all.extend(samples);
            errors += failed;
        }
        (all, errors)
    }
}

struct Latency {
    count: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} deliveries)",
            ms(self.p50),
            ms(self.p99),
            ms(self.max),
            self.count
        )
    }
}

fn latency(samples: &[Sample], from: Instant, to: Instant) -> Latency {
    percentiles(
        samples
            .iter()
            .filter(|s| s.at >= from && s.at < to)
            .map(|s| s.latency)
            .collect(),
    )
}

fn percentiles(mut window: Vec<Duration>) -> Latency {
    window.sort();
    let pick = |q: f64| {
        if window.is_empty() {
            Duration::ZERO
        } else {
            window[((window.len() - 1) as f64 * q).round() as usize]
        }
    };
    Latency {
        count: window.len(),
        p50: pick(0.50),
        p99: pick(0.99),
        max: window.last().copied().unwrap_or_default(),
    }
}

fn prepare(db: &Postgres) -> PgConnection {
    let mut conn = db.connect();
    conn.batch_execute("CREATE TABLE bench_effects (message_id TEXT NOT NULL)")
        .unwrap();
    conn
}

/// Time spans during which pruning was running ("on") or not ("off").
#[derive(Default)]
struct Windows {
    on: Vec<(Instant, Instant)>,
    off: Vec<(Instant, Instant)>,
}

impl Windows {
    /// Latency of the deliveries that started inside `spans`.
    fn latency(samples: &[Sample], spans: &[(Instant, Instant)]) -> Latency {
        percentiles(
            samples
                .iter()
                .filter(|s| spans.iter().any(|(from, to)| s.at >= *from && s.at < *to))
                .map(|s| s.latency)
                .collect(),
        )
    }

    fn idle(&mut self, length: Duration) {
        let from = Instant::now();
        thread::sleep(length);
        self.off.push((from, Instant::now()));
    }
}

/// Pruning and idle spans of about a second alternate, so that whatever
/// else loads the machine weighs on both sides of the comparison alike.
const SPAN: Duration = Duration::from_secs(1);

/// Prunes `rows` expired ids (or until `cap` of pruning time has passed) in
/// spans alternating with idle spans, and prints throughput and latencies.
fn batched(rows: u64, prune: &Prune, batch: u32, pause: Duration, cap: Option<Duration>) {
    let db = Postgres::open().expect("PostgreSQL");
    let mut conn = prepare(&db);
    let filled = fill(&mut conn, rows, "old");

    let traffic = Traffic::start(db.url());
    thread::sleep(Duration::from_secs(2)); // warm-up, not measured
    let mut windows = Windows::default();
    let (mut deleted, mut batches, mut pruning_time) = (0, 0, Duration::ZERO);
    loop {
        windows.idle(SPAN);
        let from = Instant::now();
        let report = prune
            .run_with_progress(&mut conn, |progress| {
                if progress.elapsed >= SPAN {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .expect("pruning succeeds");
        windows.on.push((from, Instant::now()));
        deleted += report.rows_deleted;
        batches += report.batches;
        pruning_time += report.elapsed;
        if report.caught_up || cap.is_some_and(|cap| pruning_time >= cap) {
            break;
        }
    }
    windows.idle(SPAN);
    let (samples, errors) = traffic.stop();

    let off = Windows::latency(&samples, &windows.off);
    let on = Windows::latency(&samples, &windows.on);
    println!(
        "batched delete, batch {batch}, pause {pause:?} (fill: {:.1} s)\n  \
         pruned {deleted} rows in {batches} batches in {:.2} s of pruning: {:.0} rows/s\n  \
         live deliveries while not pruning: {off}\n  \
         live deliveries while pruning:     {on}\n  \
         p99 pruning / not pruning: {:.2}; handler errors: {errors}\n",
        filled.as_secs_f64(),
        pruning_time.as_secs_f64(),
        deleted as f64 / pruning_time.as_secs_f64(),
        ratio(on.p99, off.p99),
    );
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

fn generations(rows: u64, policy: &RetentionPolicy) {
    const GENERATIONS: u64 = 5;
    let db = Postgres::open().expect("PostgreSQL");
    let mut conn = prepare(&db);
    partitioned::setup(&mut conn).unwrap();
    // The expired ids in generations 1 to 5; generation 6 is current.
    let started = Instant::now();
    for generation in 1..=GENERATIONS {
        fill(&mut conn, rows / GENERATIONS, &format!("old{generation}"));
        partitioned::rotate(&mut conn, partitioned::DEFAULT_LOCK_TIMEOUT).unwrap();
    }
    let filled = started.elapsed();

    let traffic = Traffic::start(db.url());
    thread::sleep(Duration::from_secs(2)); // warm-up, not measured
    let mut windows = Windows::default();
    let (mut dropped, mut deleted, mut dropping_time) = (0, 0, Duration::ZERO);
    for generation in 1..=GENERATIONS {
        windows.idle(SPAN);
        // Generation `generation` ended a month ago.
        conn.batch_execute(&format!(
            "UPDATE inbox_generations SET started_at = now() - interval '31 days', \
             ended_at = now() - interval '30 days' WHERE generation = {generation}"
        ))
        .unwrap();
        let from = Instant::now();
        let report = partitioned::drop_expired(&mut conn, policy).expect("dropping succeeds");
        windows.on.push((from, Instant::now()));
        dropped += report.partitions_dropped;
        deleted += report.rows_deleted;
        dropping_time += report.elapsed;
    }
    windows.idle(SPAN);
    let mut rotations = Windows::default();
    let mut rotation_time = Duration::ZERO;
    for _ in 0..GENERATIONS {
        let from = Instant::now();
        partitioned::rotate(&mut conn, partitioned::DEFAULT_LOCK_TIMEOUT).unwrap();
        rotation_time += from.elapsed();
        rotations.on.push((from, Instant::now()));
        windows.idle(SPAN);
    }
    let (samples, errors) = traffic.stop();

    let off = Windows::latency(&samples, &windows.off);
    let on = Windows::latency(&samples, &windows.on);
    let around_rotations = Windows::latency(&samples, &rotations.on);
    println!(
        "generation layout, {GENERATIONS} generations of {} expired ids (fill: {:.1} s)\n  \
         dropped {dropped} generations ({deleted} rows, the planner's estimate) in {:.1} ms in all: \
         {:.0} rows/s, {:.1} ms per generation\n  \
         live deliveries while not dropping: {off}\n  \
         live deliveries while dropping:     {on}\n  \
         p99 dropping / not dropping: {:.2}; handler errors: {errors}\n  \
         {GENERATIONS} rotations, {:.1} ms each; deliveries that overlapped one: {around_rotations}\n",
        rows / GENERATIONS,
        filled.as_secs_f64(),
        dropping_time.as_secs_f64() * 1e3,
        deleted as f64 / dropping_time.as_secs_f64(),
        dropping_time.as_secs_f64() * 1e3 / GENERATIONS as f64,
        ratio(on.p99, off.p99),
        rotation_time.as_secs_f64() * 1e3 / GENERATIONS as f64,
    );
}

/// The claim's cost on each layout: the generation layout's trigger looks
/// the id up in every archived generation.
fn claim_cost() {
    for layout in ["plain", "generation (7 archived generations)"] {
        let db = Postgres::open().expect("PostgreSQL");
        let mut conn = prepare(&db);
        if layout != "plain" {
            partitioned::setup(&mut conn).unwrap();
            for _ in 0..7 {
                conn.batch_execute(
                    "INSERT INTO inbox_messages (handler, message_id) \
                     SELECT 'bench.old', 'old-' || g FROM generate_series(1, 10000) AS g",
                )
                .unwrap();
                partitioned::rotate(&mut conn, partitioned::DEFAULT_LOCK_TIMEOUT).unwrap();
            }
        }
        let traffic = Traffic::start(db.url());
        thread::sleep(Duration::from_secs(4));
        let (samples, errors) = traffic.stop();
        let first = samples.iter().map(|s| s.at).min().unwrap();
        let measured = latency(&samples, first + Duration::from_secs(1), Instant::now());
        println!("claim + effect on the {layout} layout: {measured}; errors: {errors}");
    }
    println!();
}
