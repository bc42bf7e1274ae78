//! What draining a large outbox backlog costs the claim path, on
//! PostgreSQL: "a 1 M backlog drained with the claim path's p99 ≤ 1.5× of
//! idle".
//!
//! ```text
//! cargo bench -p inbox-tests --bench outbox_backlog --features outbox-brokers
//! INBOX_BENCH_BACKLOG=200000 INBOX_BENCH_RELAYS=2 cargo bench -p inbox-tests --bench outbox_backlog --features outbox-brokers
//! ```
//!
//! 1. **The backlog**: a schema of its own (`inbox_tests::Postgres`), and
//!    `INBOX_BENCH_BACKLOG` (1,000,000) pending messages in `inbox_outbox`,
//!    written by one server-side `INSERT … SELECT … FROM generate_series`
//!    (seconds; `outbox::send` would cost a round trip per message). Each
//!    row copies the destination, headers and payload of a template message
//!    that `outbox::send` recorded first (128 bytes, two headers, as the
//!    `throughput` bench's `outbox` variant; then deleted), so the stored
//!    bytes are the runtime's own; its id is made in SQL in the runtime's
//!    `OutboxId` format: a UUID version 7 whose first 48 bits are Unix
//!    milliseconds and next 12 a counter within the millisecond (4,096 ids a
//!    millisecond, as one process makes them at full speed, ending a minute
//!    before the fill), the last 62 bits random. The fill is checked (count,
//!    format, ids ascending with `position`), then `VACUUM (ANALYZE)` and
//!    `CHECKPOINT`: a backlog that built up over time has been vacuumed and
//!    analyzed, and the first window should not pay for the fill's
//!    checkpoint.
//! 2. **The claim path**: one blocking connection on a thread of its own
//!    delivering through an `#[idempotent]` handler whose body is one
//!    `UPDATE` of an account row (the `throughput` bench's `handler`
//!    variant), every delivery a new id, at a steady rate: one delivery
//!    every `INBOX_BENCH_INTERVAL_US` (2,000 µs; 0: closed loop). A
//!    delivery's latency is the handler call's duration; the "from
//!    schedule" latency counts from when the delivery was due, so a stall
//!    also shows in the deliveries queued behind it.
//! 3. **Windows**: `INBOX_BENCH_ROUNDS` (5) rounds, each an idle window (no
//!    relay) and a draining window of `INBOX_BENCH_WINDOW_MS` (5,000 ms)
//!    each. The draining window's relays (`INBOX_BENCH_RELAYS`, 1) are
//!    `BackgroundRelay` tasks (`Relay::new()` with batches of
//!    `INBOX_BENCH_BATCH`, 100, the default) on a deadpool pool, publishing
//!    to NATS JetStream through `JetStreamPublisher` (a stream of its own
//!    keeping the last 100,000 messages; `INBOX_BENCH_PUBLISHER=discard`:
//!    a publisher that confirms everything at once, to take the broker out).
//!    They start `INBOX_BENCH_GAP_MS` (1,000 ms) before their window, and
//!    every window is followed by such a gap, unmeasured. Then, if messages
//!    remain, the relays drain the rest (the claim path still measured, as
//!    "draining, tail") for at most `INBOX_BENCH_DRAIN_BUDGET_S` (150 s).
//!    `INBOX_BENCH_RELAY_SESSION`: SQL each relay connection runs once
//!    connected (`SET synchronous_commit = off`, say), to try a setting
//!    on the relay's sessions alone; `INBOX_BENCH_RELAY_RATE`: at most so
//!    many messages a second per relay (`BackgroundRelay::max_rate`; 0, the
//!    default: as fast as it goes), to see what a paced relay costs the
//!    claim path.
//!
//! It prints, per window, the claim path's p50/p99/max, the messages
//! published, the WAL written, the checkpoints and how busy the machine's
//! CPUs were (every process's share, from `/proc/stat`). Then per mode
//! (idle, draining, tail), over all its windows: p50/p99/max and p99 from
//! schedule; a delivery's parts (`BEGIN` and the claim, the body's
//! `UPDATE`, the `COMMIT`); how long the claim thread and its server
//! process waited for a CPU during a delivery (Linux `schedstat` run
//! delay, when the server runs on this machine). Then p99(draining) ÷
//! p99(idle), pooled and per round (median, range); the drain rate in the
//! windows and the total drain time when the backlog empties within the
//! budget; and the relay's rounds: the time between two publishes of a
//! relay (the mark, the checkout and the next lease: the database's part
//! of a round) and the publish's own. It asserts nothing but the fill and
//! that every leased message was published. Servers:
//! `INBOX_TEST_POSTGRES_URL`, `INBOX_TEST_NATS_URL`. The default run took
//! 2.5 to 4 minutes on a 2-CPU machine.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, stream};
use diesel::connection::SimpleConnection as _;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Binary, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::{AsyncConnection as _, AsyncPgConnection, SimpleAsyncConnection as _};
use inbox_runtime::background::WorkerTask;
use inbox_runtime::idempotent;
use inbox_runtime::outbox::{
    self, BackgroundRelay, JetStreamPublisher, OutboxMessage, OutgoingMessage, PublishError,
    Publisher, Relay, RelayRound,
};
use inbox_tests::{Postgres, TestBackend};

const PAYLOAD: [u8; 128] = [b'x'; 128];

/// The window a claim sample or a relay round belongs to when it falls in
/// no window (the gaps).
const GAP: usize = usize::MAX;

/// The shape of an `OutboxId`: a UUID version 7 in lowercase text.
const UUID_V7: &str = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$";

diesel::table! {
    /// The claim path's effect: one row, `UPDATE`d by every delivery.
    bench_account (id) {
        /// The account.
        id -> BigInt,
        /// Its balance.
        cents -> BigInt,
    }
}

struct Payment {
    id: u64,
    /// When the body started and ended: what comes before it is the
    /// transaction's start and the claim, after it the commit.
    body: Cell<Option<(Instant, Instant)>>,
}

/// The claim path: the claim and one `UPDATE`, in one transaction.
#[idempotent(id = msg.id, handler = "bench.outbox_backlog")]
fn apply(conn: &mut PgConnection, msg: &Payment) -> QueryResult<()> {
    let start = Instant::now();
    diesel::update(bench_account::table.find(1_i64))
        .set(bench_account::cents.eq(bench_account::cents + 1))
        .execute(conn)?;
    msg.body.set(Some((start, Instant::now())));
    Ok(())
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value}: not a number"))
    })
}

struct Config {
    backlog: u64,
    rounds: usize,
    window: Duration,
    gap: Duration,
    relays: usize,
    batch: u32,
    interval: Duration,
    discard: bool,
    drain_budget: Duration,
    relay_session: Option<String>,
    relay_rate: u64,
}

impl Config {
    fn from_env() -> Config {
        let publisher =
            std::env::var("INBOX_BENCH_PUBLISHER").unwrap_or_else(|_| "jetstream".to_owned());
        assert!(
            matches!(publisher.as_str(), "jetstream" | "discard"),
            "INBOX_BENCH_PUBLISHER: `jetstream` or `discard`, not `{publisher}`"
        );
        Config {
            backlog: env_number("INBOX_BENCH_BACKLOG", 1_000_000),
            rounds: env_number("INBOX_BENCH_ROUNDS", 5) as usize,
            window: Duration::from_millis(env_number("INBOX_BENCH_WINDOW_MS", 5_000)),
            gap: Duration::from_millis(env_number("INBOX_BENCH_GAP_MS", 1_000)),
            relays: env_number("INBOX_BENCH_RELAYS", 1).max(1) as usize,
            batch: env_number("INBOX_BENCH_BATCH", 100) as u32,
            interval: Duration::from_micros(env_number("INBOX_BENCH_INTERVAL_US", 2_000)),
            discard: publisher == "discard",
            drain_budget: Duration::from_secs(env_number("INBOX_BENCH_DRAIN_BUDGET_S", 150)),
            relay_rate: env_number("INBOX_BENCH_RELAY_RATE", 0),
            relay_session: std::env::var("INBOX_BENCH_RELAY_SESSION")
                .ok()
                .filter(|sql| !sql.trim().is_empty()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Idle,
    Draining,
    Tail,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Idle => "idle",
            Mode::Draining => "draining",
            Mode::Tail => "draining, tail",
        }
    }
}

/// One measured window.
struct Window {
    mode: Mode,
    round: usize,
    length: Duration,
    published: u64,
    wal_bytes: i64,
    checkpoints: i64,
    /// The machine's CPUs busy (all processes), 0 to 1.
    busy: f64,
}

/// One delivery of the claim path.
#[derive(Clone, Copy)]
struct Sample {
    window: usize,
    /// The handler call, in milliseconds.
    service: f64,
    /// From when the delivery was due to its end, in milliseconds.
    from_schedule: f64,
    /// Its parts, in milliseconds: the transaction's start and the claim
    /// (`BEGIN`, the claim's `INSERT`), the body (`UPDATE`), the commit.
    claim: f64,
    body: f64,
    commit: f64,
    /// How long, during the delivery, the claim thread and its server
    /// process waited for a CPU (runnable, not running: Linux's
    /// `schedstat` run delay), in milliseconds; `None` where it cannot be
    /// read (another OS, a remote server).
    run_queue: Option<f64>,
}

/// One relay round's times, in milliseconds: from the relay's previous
/// publish to this one (its mark, the checkout, this round's lease), and
/// this publish.
#[derive(Clone, Copy)]
struct RoundTimes {
    window: usize,
    between: Option<f64>,
    publish: f64,
}

/// Where the claim path and the relays report: the window now measured,
/// the claim samples, what the relays published, when a round first found
/// nothing, their failures and round times.
struct Shared {
    window: AtomicUsize,
    claims: Mutex<Vec<Sample>>,
    published: AtomicU64,
    drained: Mutex<Option<Instant>>,
    failures: AtomicU64,
    last_failure: Mutex<Option<String>>,
    rounds: Mutex<Vec<RoundTimes>>,
}

impl Shared {
    fn drained(&self) -> Option<Instant> {
        *self.drained.lock().unwrap()
    }
}

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        println!(
            "outbox backlog benchmark: run it with `cargo bench -p inbox-tests --bench outbox_backlog --features outbox-brokers`"
        );
        return;
    }
    let config = Config::from_env();
    let Some(db) = Postgres::open() else {
        println!("outbox backlog benchmark: PostgreSQL is not reachable");
        return;
    };
    let started = Instant::now();
    let mut stats = db.connect();
    println!(
        "{} CPUs, load average {}; {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average(),
        server_settings(&mut stats)
    );
    println!(
        "backlog {}; {} rounds of {} ms idle + {} ms draining ({} ms gaps); {} relay(s), batches of {}, to {}{}; claim path: {}\n",
        thousands(config.backlog),
        config.rounds,
        config.window.as_millis(),
        config.window.as_millis(),
        config.gap.as_millis(),
        config.relays,
        config.batch,
        if config.discard {
            "a publisher that discards"
        } else {
            "NATS JetStream"
        },
        if config.relay_rate > 0 {
            format!(" (paced: at most {} msg/s each)", config.relay_rate)
        } else {
            String::new()
        },
        if config.interval.is_zero() {
            "closed loop".to_owned()
        } else {
            format!("one delivery every {} µs", config.interval.as_micros())
        },
    );

    let runtime = inbox_tests::runtime::multi_thread(2);
    let _entered = runtime.enter();
    let (js, run) = if config.discard {
        (None, inbox_tests::unique_name("bench"))
    } else {
        let url = std::env::var("INBOX_TEST_NATS_URL")
            .unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
        let js = runtime
            .block_on(async { jetstream::new(async_nats::connect(&url).await.expect("NATS")) });
        let run = inbox_tests::unique_name("bench");
        runtime
            .block_on(js.create_stream(stream::Config {
                name: run.clone(),
                subjects: vec![format!("{run}.>")],
                // Bounded: the oldest go once 100,000 are stored.
                max_messages: 100_000,
                discard: stream::DiscardPolicy::Old,
                ..Default::default()
            }))
            .expect("a stream");
        (Some(js), run)
    };
    let destination = format!("{run}.receipts");

    let mut conn = db.connect();
    conn.batch_execute(
        "CREATE TABLE bench_account (id BIGINT PRIMARY KEY, cents BIGINT NOT NULL);
         INSERT INTO bench_account VALUES (1, 0);",
    )
    .expect("the account table");
    fill(&mut conn, &destination, config.backlog);
    drop(conn);

    let shared = Arc::new(Shared {
        window: AtomicUsize::new(GAP),
        claims: Mutex::new(Vec::new()),
        published: AtomicU64::new(0),
        drained: Mutex::new(None),
        failures: AtomicU64::new(0),
        last_failure: Mutex::new(None),
        rounds: Mutex::new(Vec::new()),
    });
    let mut manager = ManagerConfig::<AsyncPgConnection>::default();
    if let Some(sql) = config.relay_session.clone() {
        println!("relay connections run: {sql}");
        manager.custom_setup = Box::new(move |url| {
            let (url, sql) = (url.to_owned(), sql.clone());
            Box::pin(async move {
                let mut conn = AsyncPgConnection::establish(&url).await?;
                conn.batch_execute(&sql)
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        });
    }
    let pool = Pool::builder(AsyncDieselConnectionManager::new_with_config(
        db.url(),
        manager,
    ))
    .max_size(config.relays)
    .build()
    .expect("a pool");
    // The relays' connections, opened before the first window.
    runtime.block_on(async {
        let mut held = Vec::new();
        for _ in 0..config.relays {
            held.push(pool.get().await.expect("a relay connection"));
        }
    });
    let start_relays = || -> Vec<WorkerTask> {
        (0..config.relays)
            .map(|_| {
                let relay = BackgroundRelay::new(Relay::new().batch_size(config.batch))
                    .max_rate(u32::try_from(config.relay_rate).unwrap_or(u32::MAX));
                let on_round = {
                    let shared = Arc::clone(&shared);
                    move |round: &RelayRound| on_round(&shared, round)
                };
                match &js {
                    Some(js) => relay.spawn_task(
                        pool.clone(),
                        Timed::new(JetStreamPublisher::new(js.clone()), &shared),
                        on_round,
                    ),
                    None => relay.spawn_task(pool.clone(), Timed::new(Discard, &shared), on_round),
                }
            })
            .collect()
    };
    let stop_relays = |tasks: Vec<WorkerTask>| {
        runtime.block_on(async {
            for task in tasks {
                task.stop().await.expect("a relay");
            }
        })
    };

    let stop_claims = Arc::new(AtomicBool::new(false));
    let claims = {
        let url = db.url().to_owned();
        let shared = Arc::clone(&shared);
        let stop = Arc::clone(&stop_claims);
        let interval = config.interval;
        std::thread::spawn(move || claim_loop(&url, interval, &shared, &stop))
    };
    std::thread::sleep(config.gap);

    let mut windows: Vec<Window> = Vec::new();
    // How long relays ran, and how long they ran until a round found
    // nothing left.
    let mut relay_time = Duration::ZERO;
    let mut drained_at: Option<Duration> = None;
    let mut account = |since: Instant, relay_time: &mut Duration| {
        if drained_at.is_none() {
            drained_at = shared.drained().map(|at| *relay_time + (at - since));
        }
        *relay_time += since.elapsed();
    };
    for round in 1..=config.rounds {
        for mode in [Mode::Idle, Mode::Draining] {
            let relays = (mode == Mode::Draining).then(|| (Instant::now(), start_relays()));
            if relays.is_some() {
                std::thread::sleep(config.gap);
            }
            let index = measure_window(&mut stats, &shared, &mut windows, mode, round, || {
                std::thread::sleep(config.window);
            });
            print_window(&windows[index], &shared, index);
            if let Some((since, tasks)) = relays {
                stop_relays(tasks);
                account(since, &mut relay_time);
            }
            std::thread::sleep(config.gap);
        }
    }

    // The rest of the backlog, the claim path still measured.
    let mut tail_budget_spent = false;
    if shared.drained().is_none() && !config.drain_budget.is_zero() {
        let since = Instant::now();
        let tasks = start_relays();
        let budget = config.drain_budget;
        let index = measure_window(&mut stats, &shared, &mut windows, Mode::Tail, 0, || {
            while shared.drained().is_none() && since.elapsed() < budget {
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        stop_relays(tasks);
        tail_budget_spent = shared.drained().is_none();
        account(since, &mut relay_time);
        print_window(&windows[index], &shared, index);
    }
    stop_claims.store(true, Ordering::Relaxed);
    claims.join().expect("the claim path");
    let samples = std::mem::take(&mut *shared.claims.lock().unwrap());

    let backlog = outbox::backlog(&mut stats).expect("the backlog");
    let published = shared.published.load(Ordering::Relaxed);
    println!();
    summarize(&config, &windows, &samples, &shared);
    println!(
        "\ndrain: {} published in {:.1} s of relay time ({:.0} msg/s overall, relays' warm-up gaps included); {} pending at the end; {}",
        thousands(published),
        relay_time.as_secs_f64(),
        published as f64 / relay_time.as_secs_f64(),
        thousands(backlog.pending),
        match drained_at {
            Some(at) => format!(
                "the backlog of {} drained in {:.1} s of relay time",
                thousands(config.backlog),
                at.as_secs_f64()
            ),
            None if tail_budget_spent => format!(
                "not drained within the budget of {} s",
                config.drain_budget.as_secs()
            ),
            None => "not drained (no tail: INBOX_BENCH_DRAIN_BUDGET_S=0)".to_owned(),
        }
    );
    let failures = shared.failures.load(Ordering::Relaxed);
    if failures > 0 {
        println!(
            "relay rounds failed or given back: {failures} (last: {})",
            shared
                .last_failure
                .lock()
                .unwrap()
                .as_deref()
                .unwrap_or("?")
        );
    }
    println!(
        "outbox table after the run: {}",
        table_sizes(&mut stats).unwrap_or_else(|error| format!("? ({error})"))
    );
    if let Some(js) = &js {
        let _ = runtime.block_on(js.delete_stream(&run));
    }
    println!(
        "\ndone in {:.0} s; load average {}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
}

/// Runs `wait` as window number `windows.len()` of `mode`: the relays'
/// and the claim path's reports in it are tagged with its number; the
/// published messages, WAL and checkpoints are the difference across it.
fn measure_window(
    stats: &mut PgConnection,
    shared: &Shared,
    windows: &mut Vec<Window>,
    mode: Mode,
    round: usize,
    wait: impl FnOnce(),
) -> usize {
    let (wal_before, checkpoints_before) = server_counters(stats);
    let published_before = shared.published.load(Ordering::Relaxed);
    let cpu_before = cpu_times();
    let start = Instant::now();
    shared.window.store(windows.len(), Ordering::Relaxed);
    wait();
    shared.window.store(GAP, Ordering::Relaxed);
    let length = start.elapsed();
    let cpu_after = cpu_times();
    let published = shared.published.load(Ordering::Relaxed) - published_before;
    let (wal_after, checkpoints_after) = server_counters(stats);
    windows.push(Window {
        mode,
        round,
        length,
        published,
        wal_bytes: wal_after - wal_before,
        checkpoints: checkpoints_after - checkpoints_before,
        busy: (cpu_after.0 - cpu_before.0) as f64 / (cpu_after.1 - cpu_before.1).max(1) as f64,
    });
    windows.len() - 1
}

fn print_window(window: &Window, shared: &Shared, index: usize) {
    let mut service: Vec<f64> = shared
        .claims
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.window == index)
        .map(|s| s.service)
        .collect();
    let round = if window.mode == Mode::Tail {
        "tail    ".to_owned()
    } else {
        format!("round {:2}", window.round)
    };
    println!(
        "{round} {:9} {:6.1} s: {:5} deliveries, p50 {:6.2} ms, p99 {:6.2} ms, max {:7.2} ms; published {:>9} ({:6.0} msg/s); WAL {:6.1} MB, {} checkpoint(s); CPUs {:3.0} % busy",
        window.mode.name(),
        window.length.as_secs_f64(),
        service.len(),
        quantile(&mut service, 0.5),
        quantile(&mut service, 0.99),
        quantile(&mut service, 1.0),
        thousands(window.published),
        window.published as f64 / window.length.as_secs_f64(),
        window.wal_bytes as f64 / 1e6,
        window.checkpoints,
        window.busy * 100.0,
    );
}

fn summarize(config: &Config, windows: &[Window], samples: &[Sample], shared: &Shared) {
    println!("claim path (#[idempotent], one UPDATE, one connection), over all windows of a mode:");
    println!(
        "  {:15} {:>10} {:>9} {:>9} {:>9} {:>19} {:>10}   p50 / p99 ms of BEGIN+claim, UPDATE, COMMIT",
        "mode", "deliveries", "p50 ms", "p99 ms", "max ms", "p99 from schedule", "msg/s"
    );
    let p99 = |mode: Mode| -> Option<f64> {
        let in_mode: Vec<&Sample> = samples
            .iter()
            .filter(|s| windows.get(s.window).is_some_and(|w| w.mode == mode))
            .collect();
        if in_mode.is_empty() {
            return None;
        }
        let mut service: Vec<f64> = in_mode.iter().map(|s| s.service).collect();
        let mut late: Vec<f64> = in_mode.iter().map(|s| s.from_schedule).collect();
        let parts = [
            |s: &Sample| s.claim,
            |s: &Sample| s.body,
            |s: &Sample| s.commit,
        ]
        .map(|part| {
            let mut values: Vec<f64> = in_mode.iter().map(|s| part(s)).collect();
            format!(
                "{:.2} / {:.2}",
                quantile(&mut values, 0.5),
                quantile(&mut values, 0.99)
            )
        })
        .join(", ");
        let (length, published) = windows
            .iter()
            .filter(|w| w.mode == mode)
            .fold((0.0, 0), |(l, p), w| {
                (l + w.length.as_secs_f64(), p + w.published)
            });
        let p99 = quantile(&mut service, 0.99);
        println!(
            "  {:15} {:>10} {:9.2} {:9.2} {:9.2} {:19.2} {:>10}   {parts}",
            mode.name(),
            in_mode.len(),
            quantile(&mut service, 0.5),
            p99,
            quantile(&mut service, 1.0),
            quantile(&mut late, 0.99),
            if mode == Mode::Idle {
                "-".to_owned()
            } else {
                format!("{:.0}", published as f64 / length)
            }
        );
        let queued: Vec<(f64, f64)> = in_mode
            .iter()
            .filter_map(|s| Some((s.run_queue?, s.service)))
            .collect();
        if !queued.is_empty() {
            let mut waits: Vec<f64> = queued.iter().map(|(q, _)| *q).collect();
            let mut without: Vec<f64> = queued.iter().map(|(q, s)| s - q).collect();
            let mut slow: Vec<(f64, f64)> = queued.clone();
            slow.sort_by(|a, b| b.1.total_cmp(&a.1));
            slow.truncate((queued.len() / 100).max(1));
            let share =
                slow.iter().map(|(q, _)| q).sum::<f64>() / slow.iter().map(|(_, s)| s).sum::<f64>();
            println!(
                "  {:15} waiting for a CPU (claim thread + its server process): p50 {:.2} ms, p99 {:.2} ms; {:.0} % of the slowest 1 %'s time; p99 without it {:.2} ms",
                "",
                quantile(&mut waits, 0.5),
                quantile(&mut waits, 0.99),
                share * 100.0,
                quantile(&mut without, 0.99),
            );
        }
        Some(p99)
    };
    let idle = p99(Mode::Idle);
    let draining = p99(Mode::Draining);
    let _ = p99(Mode::Tail);
    if let (Some(idle), Some(draining)) = (idle, draining) {
        let mut ratios: Vec<f64> = (1..=config.rounds)
            .filter_map(|round| {
                let p99_in = |mode: Mode| {
                    let index = windows
                        .iter()
                        .position(|w| w.round == round && w.mode == mode)?;
                    let mut values: Vec<f64> = samples
                        .iter()
                        .filter(|s| s.window == index)
                        .map(|s| s.service)
                        .collect();
                    (!values.is_empty()).then(|| quantile(&mut values, 0.99))
                };
                Some(p99_in(Mode::Draining)? / p99_in(Mode::Idle)?)
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "p99 draining ÷ idle: {:.2} pooled; per round median {:.2} (range {:.2}–{:.2}); the floor is ≤ 1.5: {}",
            draining / idle,
            quantile(&mut ratios, 0.5),
            ratios.first().copied().unwrap_or(f64::NAN),
            ratios.last().copied().unwrap_or(f64::NAN),
            if draining / idle <= 1.5 {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    let rounds = shared.rounds.lock().unwrap();
    for mode in [Mode::Draining, Mode::Tail] {
        let in_mode: Vec<&RoundTimes> = rounds
            .iter()
            .filter(|r| windows.get(r.window).is_some_and(|w| w.mode == mode))
            .collect();
        if in_mode.is_empty() {
            continue;
        }
        let mut between: Vec<f64> = in_mode.iter().filter_map(|r| r.between).collect();
        let mut publish: Vec<f64> = in_mode.iter().map(|r| r.publish).collect();
        println!(
            "relay rounds ({}): {} rounds; between publishes (mark, checkout, lease) p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms; publish p50 {:.2} ms, p99 {:.2} ms",
            mode.name(),
            in_mode.len(),
            quantile(&mut between, 0.5),
            quantile(&mut between, 0.99),
            quantile(&mut between, 1.0),
            quantile(&mut publish, 0.5),
            quantile(&mut publish, 0.99),
        );
    }
}

/// Records `count` pending messages to `destination`: see the module's
/// documentation.
fn fill(conn: &mut PgConnection, destination: &str, count: u64) {
    #[derive(QueryableByName)]
    struct Template {
        #[diesel(sql_type = Text)]
        id: String,
        #[diesel(sql_type = Binary)]
        headers: Vec<u8>,
        #[diesel(sql_type = Binary)]
        payload: Vec<u8>,
    }

    let message = OutgoingMessage::new(destination, &PAYLOAD[..])
        .header("content-type", "application/octet-stream")
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
    conn.transaction(|conn| outbox::send(conn, &message))
        .expect("the template message");
    let template: Template = diesel::sql_query("SELECT id, headers, payload FROM inbox_outbox")
        .get_result(conn)
        .expect("the template's row");
    assert_eq!(
        diesel::sql_query("DELETE FROM inbox_outbox")
            .execute(conn)
            .expect("delete the template"),
        1
    );
    let now_millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as i64;
    let first_millis = now_millis - 60_000 - (count / 4096) as i64;
    let start = Instant::now();
    let inserted = diesel::sql_query(
        "INSERT INTO inbox_outbox (id, destination, headers, payload) \
         SELECT lpad(to_hex(ms >> 16), 8, '0') || '-' || lpad(to_hex(ms & 65535), 4, '0') \
             || '-' || to_hex(28672 | counter) \
             || '-' || to_hex(32768 | floor(random() * 16384)::int) \
             || '-' || lpad(to_hex(floor(random() * 281474976710656)::bigint), 12, '0'), \
             $1, $2, $3 \
         FROM (SELECT g, $4::bigint + g / 4096 AS ms, (g % 4096)::int AS counter \
               FROM generate_series(0::bigint, $5::bigint - 1) AS g) AS s \
         ORDER BY g",
    )
    .bind::<Text, _>(destination)
    .bind::<Binary, _>(&template.headers)
    .bind::<Binary, _>(&template.payload)
    .bind::<BigInt, _>(first_millis)
    .bind::<BigInt, _>(count as i64)
    .execute(conn)
    .expect("fill the outbox");
    let inserted_in = start.elapsed();
    assert_eq!(inserted as u64, count);
    let vacuum = Instant::now();
    conn.batch_execute("VACUUM (ANALYZE) inbox_outbox")
        .expect("vacuum");
    let vacuumed_in = vacuum.elapsed();
    conn.batch_execute("CHECKPOINT").expect("checkpoint");

    #[derive(QueryableByName)]
    struct Check {
        #[diesel(sql_type = BigInt)]
        pending: i64,
        #[diesel(sql_type = BigInt)]
        malformed: i64,
        #[diesel(sql_type = BigInt)]
        out_of_order: i64,
        #[diesel(sql_type = Text)]
        first: String,
    }
    let check: Check = diesel::sql_query(format!(
        "SELECT count(*) AS pending, \
             count(*) FILTER (WHERE id !~ '{UUID_V7}') AS malformed, \
             count(*) FILTER (WHERE id COLLATE \"C\" < previous COLLATE \"C\") AS out_of_order, \
             min(id) AS first \
         FROM (SELECT id, lag(id) OVER (ORDER BY position) AS previous FROM inbox_outbox \
               WHERE sent_at IS NULL AND dead_at IS NULL) AS rows"
    ))
    .get_result(conn)
    .expect("check the fill");
    assert_eq!(check.pending as u64, count, "pending messages");
    assert_eq!(check.malformed, 0, "ids not in the OutboxId format");
    assert_eq!(
        check.out_of_order, 0,
        "ids not ascending with their position"
    );
    let shape = regex_like_v7(&template.id);
    assert!(shape, "the runtime's own id {} is a UUIDv7", template.id);
    println!(
        "backlog: {} messages inserted in {:.1} s ({:.0}/s, server-side INSERT … SELECT), VACUUM (ANALYZE) {:.1} s; ids like the runtime's {} (first: {}); {}\n",
        thousands(count),
        inserted_in.as_secs_f64(),
        count as f64 / inserted_in.as_secs_f64(),
        vacuumed_in.as_secs_f64(),
        template.id,
        check.first,
        table_sizes(conn).unwrap_or_else(|error| format!("? ({error})"))
    );
}

/// Whether `id` has the shape of [`UUID_V7`].
fn regex_like_v7(id: &str) -> bool {
    let bytes = id.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(at, &b)| match at {
            8 | 13 | 18 | 23 => b == b'-',
            14 => b == b'7',
            19 => matches!(b, b'8' | b'9' | b'a' | b'b'),
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// The claim path until `stop`: its samples.
fn claim_loop(url: &str, interval: Duration, shared: &Shared, stop: &AtomicBool) {
    let mut conn = PgConnection::establish(url).expect("the claim connection");
    let mut next_id = 0_u64;
    for _ in 0..200 {
        next_id += 1;
        let payment = Payment {
            id: next_id,
            body: Cell::new(None),
        };
        apply(&mut conn, &payment).expect("a warm-up delivery");
    }
    #[derive(QueryableByName)]
    struct Pid {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
    }
    let backend: Pid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result(&mut conn)
        .expect("the claim connection's server process");
    let server_schedstat = format!("/proc/{}/schedstat", backend.pid);
    let run_delay = || -> Option<u64> {
        Some(run_delay_nanos("/proc/thread-self/schedstat")? + run_delay_nanos(&server_schedstat)?)
    };
    let mut due = Instant::now();
    let mut last_window = GAP;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let window = shared.window.load(Ordering::Relaxed);
        if window != last_window {
            // Each window's schedule starts afresh: a lag does not carry over.
            last_window = window;
            due = due.max(Instant::now());
        }
        next_id += 1;
        let delay_before = run_delay();
        let before = Instant::now();
        let payment = Payment {
            id: next_id,
            body: Cell::new(None),
        };
        apply(&mut conn, &payment).expect("a delivery");
        let after = Instant::now();
        let delay_after = run_delay();
        let (body_start, body_end) = payment.body.get().expect("the body ran");
        let millis = |from: Instant, to: Instant| (to - from).as_secs_f64() * 1000.0;
        let sample = Sample {
            window,
            service: millis(before, after),
            from_schedule: millis(due.min(before), after),
            claim: millis(before, body_start),
            body: millis(body_start, body_end),
            commit: millis(body_end, after),
            run_queue: delay_before
                .zip(delay_after)
                .map(|(before, after)| after.saturating_sub(before) as f64 / 1e6),
        };
        if window != GAP {
            shared.claims.lock().unwrap().push(sample);
        }
        due = if interval.is_zero() {
            after
        } else {
            due + interval
        };
    }
}

fn on_round(shared: &Shared, round: &RelayRound) {
    if let RelayRound::Done(report) = round {
        assert_eq!(
            report.published + report.unavailable,
            report.leased,
            "{report}"
        );
        shared
            .published
            .fetch_add(report.published as u64, Ordering::Relaxed);
        if report.is_idle() {
            shared
                .drained
                .lock()
                .unwrap()
                .get_or_insert_with(Instant::now);
        }
    }
    if !round.is_ok() {
        shared.failures.fetch_add(1, Ordering::Relaxed);
        *shared.last_failure.lock().unwrap() = Some(round.to_string());
    }
}

/// Confirms everything at once: the relay without a broker.
struct Discard;

impl Publisher for Discard {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        messages.iter().map(|_| Ok(())).collect()
    }
}

/// Forwards to `inner`, timing each publish and the time since the
/// previous one.
struct Timed<P> {
    inner: P,
    shared: Arc<Shared>,
    last_end: Option<Instant>,
}

impl<P> Timed<P> {
    fn new(inner: P, shared: &Arc<Shared>) -> Timed<P> {
        Timed {
            inner,
            shared: Arc::clone(shared),
            last_end: None,
        }
    }
}

impl<P: Publisher> Publisher for Timed<P> {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        let start = Instant::now();
        let answers = self.inner.publish(messages).await;
        let end = Instant::now();
        let times = RoundTimes {
            window: self.shared.window.load(Ordering::Relaxed),
            between: self
                .last_end
                .map(|last| (start - last).as_secs_f64() * 1000.0),
            publish: (end - start).as_secs_f64() * 1000.0,
        };
        if times.window != GAP {
            self.shared.rounds.lock().unwrap().push(times);
        }
        self.last_end = Some(end);
        answers
    }
}

/// WAL written so far (bytes) and checkpoints so far.
fn server_counters(conn: &mut PgConnection) -> (i64, i64) {
    #[derive(QueryableByName)]
    struct Counters {
        #[diesel(sql_type = BigInt)]
        wal: i64,
        #[diesel(sql_type = BigInt)]
        checkpoints: i64,
    }
    let counters: Counters = diesel::sql_query(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal, \
             (checkpoints_timed + checkpoints_req)::bigint AS checkpoints FROM pg_stat_bgwriter",
    )
    .get_result(conn)
    .expect("the server's counters");
    (counters.wal, counters.checkpoints)
}

/// The run delay (nanoseconds spent runnable but waiting for a CPU) in a
/// Linux `schedstat` file.
fn run_delay_nanos(path: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The machine's CPU time so far, in ticks: (busy, total).
fn cpu_times() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    let total: u64 = ticks.iter().take(8).sum();
    // idle and iowait
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// The settings that weigh on the figures.
fn server_settings(conn: &mut PgConnection) -> String {
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = Text)]
        setting: String,
    }
    let settings: Vec<Setting> = diesel::sql_query(
        "SELECT name || ' ' || setting || coalesce(unit, '') AS setting FROM pg_settings \
         WHERE name IN ('server_version', 'shared_buffers', 'autovacuum', 'synchronous_commit', \
                        'max_wal_size', 'checkpoint_timeout', 'wal_compression') ORDER BY name",
    )
    .load(conn)
    .expect("the server's settings");
    settings
        .into_iter()
        .map(|s| s.setting)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The outbox table's size and dead rows.
fn table_sizes(conn: &mut PgConnection) -> QueryResult<String> {
    #[derive(QueryableByName)]
    struct Sizes {
        #[diesel(sql_type = BigInt)]
        heap: i64,
        #[diesel(sql_type = BigInt)]
        indexes: i64,
        #[diesel(sql_type = BigInt)]
        pending_index: i64,
        #[diesel(sql_type = BigInt)]
        dead: i64,
    }
    let sizes: Sizes = diesel::sql_query(
        "SELECT pg_relation_size('inbox_outbox') AS heap, \
             pg_indexes_size('inbox_outbox') AS indexes, \
             pg_relation_size('inbox_outbox_pending_idx') AS pending_index, \
             coalesce((SELECT n_dead_tup FROM pg_stat_user_tables \
                       WHERE relid = 'inbox_outbox'::regclass), 0) AS dead",
    )
    .get_result(conn)?;
    Ok(format!(
        "heap {} MB, indexes {} MB (pending index {} MB), {} dead rows",
        sizes.heap / 1_000_000,
        sizes.indexes / 1_000_000,
        sizes.pending_index / 1_000_000,
        thousands(sizes.dead as u64)
    ))
}

/// The `q` quantile of `values` (sorted here); NaN when empty.
fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * q).round() as usize]
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (at, c) in digits.chars().enumerate() {
        if at > 0 && (digits.len() - at) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
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
