//! What observability costs per delivery: one `#[idempotent]` handler
//! applying one payment (an `UPDATE` of one row), every delivery a new id,
//! on SQLite (a file, WAL; and in memory, where the database costs least
//! and the reporting weighs most) and, when the build has `postgres` and the
//! server is there, PostgreSQL.
//!
//! The modes, each a process of its own:
//!
//! - `off`: inbox-runtime built without its `tracing` and `metrics`
//!   features (this benchmark built without the suite's);
//! - `idle`: built with both, and nothing installed: no subscriber, no
//!   recorder, what a library user pays for a feature another crate turned
//!   on;
//! - `installed`: built with both, with `tracing-subscriber`'s `fmt`
//!   subscriber at `INFO` (formatting to `io::sink`) and metrics-util's
//!   `DebuggingRecorder` installed;
//! - `subscriber`, `recorder`: one of the two only, to tell their costs
//!   apart.
//!
//! The features are chosen at compile time, so the modes need two builds:
//! `tests/benches/observe.sh` builds both, runs the modes
//! alternately (rotating their order every round, so whatever else loads
//! the machine weighs on all of them alike), and hands the lines they print
//! to `observe --summarize`, which prints each mode's median time per
//! delivery and its throughput against `off` from the same run. It asserts
//! nothing.
//!
//! ```text
//! tests/benches/observe.sh            # 15 rounds, sqlite,postgres
//! tests/benches/observe.sh 25 sqlite
//! ```
//!
//! One process (`observe --bench MODE`) measures one round: per backend, a
//! warm-up, then 1,000 deliveries (SQLite file), 5,000 (in memory) or 300
//! (PostgreSQL), printed as `sample BACKEND MODE NANOSECONDS_PER_DELIVERY`.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::{Duration, Instant};

use diesel::QueryResult;
use diesel::connection::Connection;
use diesel::connection::LoadConnection;
use inbox_runtime::{InboxBackend, idempotent};
use inbox_tests::TestBackend as _;

const WARM_UP: usize = 100;

/// The modes, in the order the summary prints them.
const MODES: [&str; 5] = ["off", "idle", "installed", "subscriber", "recorder"];

struct Payment {
    id: u64,
}

#[idempotent(id = msg.id, handler = "bench.observe")]
fn apply<C: LoadConnection<Backend: InboxBackend>>(conn: &mut C, msg: &Payment) -> QueryResult<()> {
    conn.batch_execute("UPDATE bench_account SET cents = cents + 1 WHERE id = 1")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|arg| arg == "--summarize") {
        summarize();
        return;
    }
    let Some(mode) = args
        .iter()
        .position(|arg| arg == "--bench")
        .and_then(|at| args.get(at + 1))
    else {
        println!("observe benchmark: run it with `tests/benches/observe.sh`");
        return;
    };
    let observed = cfg!(all(feature = "tracing", feature = "metrics"));
    match (mode.as_str(), observed) {
        ("off", false) | ("idle" | "installed" | "subscriber" | "recorder", true) => {}
        _ => panic!(
            "mode `{mode}` needs a build with the features {}",
            if observed { "off" } else { "on" }
        ),
    }
    #[cfg(feature = "sqlite")]
    {
        let db = inbox_tests::Sqlite::open().expect("SQLite is embedded");
        measure("sqlite", mode, 1_000, &mut db.connect());
        // In memory: no file, no fsync, so the least the database costs and
        // the most the reporting can weigh.
        let mut memory = diesel::SqliteConnection::establish(":memory:").expect("in memory");
        inbox_runtime::setup(&mut memory).expect("create the inbox table");
        measure("sqlite-memory", mode, 5_000, &mut memory);
    }
    #[cfg(feature = "postgres")]
    if let Some(db) = inbox_tests::Postgres::open() {
        measure("postgres", mode, 300, &mut db.connect());
    }
}

/// One round of `mode` on `conn`, `deliveries` long: prints the time per
/// delivery.
fn measure<C>(backend: &str, mode: &str, deliveries: usize, conn: &mut C)
where
    C: LoadConnection<Backend: InboxBackend>,
{
    conn.batch_execute(
        "CREATE TABLE bench_account (id INTEGER PRIMARY KEY, cents BIGINT NOT NULL);
         INSERT INTO bench_account VALUES (1, 0);",
    )
    .expect("create the account table");
    let mut next_id = 0_u64;
    let mut deliver = |count: usize| {
        let started = Instant::now();
        for _ in 0..count {
            next_id += 1;
            apply(conn, &Payment { id: next_id }).expect("processed");
        }
        started.elapsed()
    };
    let elapsed = installed(mode, || {
        deliver(WARM_UP);
        deliver(deliveries)
    });
    println!(
        "sample {backend} {mode} {}",
        elapsed.as_nanos() / deliveries as u128
    );
}

/// Runs `run` with what `mode` installs: the subscriber, the recorder,
/// both or neither.
#[cfg(all(feature = "tracing", feature = "metrics"))]
fn installed(mode: &str, run: impl FnOnce() -> Duration) -> Duration {
    let subscribe = matches!(mode, "installed" | "subscriber");
    let record = matches!(mode, "installed" | "recorder");
    let recorded = || {
        if !record {
            return run();
        }
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        metrics::with_local_recorder(&recorder, run)
    };
    if !subscribe {
        return recorded();
    }
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::with_default(subscriber, recorded)
}

#[cfg(not(all(feature = "tracing", feature = "metrics")))]
fn installed(mode: &str, run: impl FnOnce() -> Duration) -> Duration {
    assert_eq!(mode, "off", "a build without the features installs nothing");
    run()
}

/// Reads `sample` lines on stdin; prints, per backend, each mode's median
/// time per delivery with its quartiles over the rounds, and its throughput
/// against `off`.
fn summarize() {
    let mut samples: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("read stdin");
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let ["sample", backend, mode, nanos] = fields[..] {
            let nanos = nanos.parse().expect("nanoseconds");
            samples
                .entry((backend.to_owned(), mode.to_owned()))
                .or_default()
                .push(nanos);
        }
    }
    let mut backends: Vec<String> = samples.keys().map(|(backend, _)| backend.clone()).collect();
    backends.dedup();
    println!(
        "{} CPUs; time per delivery over the rounds (median, quartiles); throughput against `off` from the same run\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let micros = |nanos: u64| nanos as f64 / 1_000.0;
    for backend in backends {
        let mut quartiles = |mode: &str| {
            let rounds = samples.get_mut(&(backend.clone(), mode.to_owned()))?;
            rounds.sort_unstable();
            let at = |quarter: usize| rounds[(rounds.len() - 1) * quarter / 4];
            Some(([at(1), at(2), at(3)], rounds.len()))
        };
        let modes: Vec<_> = MODES.iter().map(|mode| (mode, quartiles(mode))).collect();
        let off = modes[0].1.map(|([_, median, _], _)| median);
        let line: Vec<String> = modes
            .iter()
            .filter_map(|(mode, quartiles)| {
                let ([p25, median, p75], rounds) = (*quartiles)?;
                let ratio = off.map_or(String::new(), |off| {
                    format!(
                        ", {:+.1} µs, throughput {:.3}x off",
                        micros(median) - micros(off),
                        off as f64 / median as f64
                    )
                });
                Some(format!(
                    "{mode} {:.1} µs ({:.1}-{:.1}, {rounds} rounds{ratio})",
                    micros(median),
                    micros(p25),
                    micros(p75)
                ))
            })
            .collect();
        println!("{backend}: {}", line.join("; "));
    }
}
