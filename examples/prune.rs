//! Prunes the inbox: deletes claimed ids older than a retention window, in
//! bounded batches, printing a progress line per batch. Made to be run from
//! cron by an operator.
//!
//! ```text
//! DATABASE_URL=postgres://app@db/app \
//!     cargo run --example prune --features postgres -- --older-than 7d
//! DATABASE_URL=mysql://app@db/app \
//!     cargo run --example prune --features mysql -- --older-than 7d --batch 5000 --handler billing.apply
//! DATABASE_URL=/var/lib/app/inbox.sqlite3 cargo run --example prune -- --older-than 30d
//! ```
//!
//! Options:
//! - `--older-than <duration>` (required): the retention window, e.g. `7d`,
//!   `36h`, `1d12h`. Ids received longer ago than this, by the database
//!   clock, are deleted.
//! - `--redelivery-window <duration>` (default `1d`): how late a message can
//!   come back (broker retries, replays). A window shorter than this is
//!   refused, because it would let those redeliveries be processed again.
//! - `--batch <rows>` (default 5000): rows per batch; each batch is its own
//!   short transaction.
//! - `--handler <name>`: prune only this handler's ids.
//! - `--pause <duration>`: sleep between batches, to leave room for live
//!   traffic (e.g. `20ms`).
//! - `--max-batches <n>`: stop after `n` batches.
//! - `--generations <count>` (PostgreSQL, generation layout only): instead
//!   of deleting rows, drop expired generations and start a new one when the
//!   current one is older than the window divided by `count` (1 to 8; 2 is
//!   the library's default).
//!
//! Interrupting it is safe: committed batches stay committed, the rest is
//! done by the next run. Exit status: 0 done, 1 database failure, 2 bad
//! arguments or policy.

use std::ops::ControlFlow;
use std::process::ExitCode;

use diesel::Connection;
use inbox_runtime::prune::BatchProgress;
use inbox_runtime::{
    retention::parse_duration, HandlerName, InboxBackend, InboxError, Prune, PruneError,
    PruneReport, RetentionPolicy,
};

/// Parsed command line.
struct Options {
    url: String,
    prune: Prune,
    generations: Option<u32>,
}

const USAGE: &str = "usage: prune --older-than <duration> [--redelivery-window <duration>] [--batch <rows>] \
                     [--handler <name>] [--pause <duration>] [--max-batches <n>] [--generations <count>]\n\
                     reads the database URL from DATABASE_URL; durations look like 7d, 36h, 90m, 1d12h";

fn main() -> ExitCode {
    let options = match parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("prune: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    println!("prune: {}", options.prune.policy());
    let result =
        if options.url.starts_with("postgres://") || options.url.starts_with("postgresql://") {
            postgres(&options)
        } else if options.url.starts_with("mysql://") {
            mysql(&options)
        } else {
            sqlite(&options)
        };
    match result {
        Ok(report) => {
            println!(
                "prune: done: {report}, {:.0} rows/s",
                report.rows_per_second()
            );
            ExitCode::SUCCESS
        }
        Err(Failure::Usage(message)) => {
            eprintln!("prune: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Connect(error)) => {
            eprintln!("prune: cannot connect: {error}");
            ExitCode::from(1)
        }
        Err(Failure::Prune(error)) => {
            eprintln!("prune: {error}");
            ExitCode::from(if error.error().is_retryable() { 1 } else { 2 })
        }
    }
}

enum Failure {
    Usage(String),
    Connect(diesel::ConnectionError),
    Prune(PruneError),
}

impl From<PruneError> for Failure {
    fn from(error: PruneError) -> Self {
        Failure::Prune(error)
    }
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut older_than = None;
    let mut redelivery_window = "1d".to_owned();
    let mut batch = None;
    let mut handler = None;
    let mut pause = None;
    let mut max_batches = None;
    let mut generations = None;
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err("help requested".to_owned());
        }
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
            None => (flag, None),
        };
        let value = match inline.or_else(|| args.next()) {
            Some(value) => value,
            None => return Err(format!("{name} needs a value")),
        };
        match name.as_str() {
            "--older-than" => older_than = Some(value),
            "--redelivery-window" => redelivery_window = value,
            "--batch" => {
                batch = Some(
                    value
                        .parse::<u32>()
                        .map_err(|_| format!("--batch: not a number: {value}"))?,
                )
            }
            "--handler" => handler = Some(HandlerName::new(value).map_err(|e| e.to_string())?),
            "--pause" => pause = Some(parse_duration(&value).map_err(|e| format!("--pause: {e}"))?),
            "--max-batches" => {
                max_batches = Some(
                    value
                        .parse::<u64>()
                        .map_err(|_| format!("--max-batches: not a number: {value}"))?,
                )
            }
            "--generations" => {
                generations = Some(value.parse::<u32>().map_err(|_| {
                    format!(
                        "--generations: not a count: {value} (the number of generations the window is split into, 1 to 8)"
                    )
                })?)
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    let older_than = older_than.ok_or("--older-than is required")?;
    let mut policy = RetentionPolicy::parse(&older_than, &redelivery_window).map_err(explain)?;
    if let Some(handler) = handler {
        policy = policy.only(handler);
    }
    let mut prune = Prune::new(policy);
    if let Some(batch) = batch {
        prune = prune.batch_size(batch);
    }
    if let Some(pause) = pause {
        prune = prune.pause(pause);
    }
    if let Some(max_batches) = max_batches {
        prune = prune.max_batches(max_batches);
    }
    prune.check().map_err(explain)?;
    let url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL to the database to prune".to_owned())?;
    Ok(Options {
        url,
        prune,
        generations,
    })
}

/// A policy error, with the way out when the window is deliberately short.
fn explain(error: InboxError) -> String {
    match &error {
        InboxError::InvalidRetention {
            problem: inbox_runtime::RetentionProblem::ShorterThanRedelivery { .. },
            ..
        } => format!(
            "{error}\nif messages really cannot come back after that long, lower --redelivery-window accordingly"
        ),
        _ => error.to_string(),
    }
}

/// Runs the batched prune on any supported connection, one line per batch.
fn batched<C>(conn: &mut C, options: &Options) -> Result<PruneReport, Failure>
where
    C: diesel::connection::LoadConnection<Backend: InboxBackend>,
{
    if options.generations.is_some() {
        return Err(Failure::Usage(
            "--generations is for PostgreSQL only".to_owned(),
        ));
    }
    let report = options
        .prune
        .run_with_progress(conn, |batch: &BatchProgress<'_>| {
            println!("{batch}");
            ControlFlow::Continue(())
        })?;
    Ok(report)
}

#[cfg(feature = "postgres")]
fn postgres(options: &Options) -> Result<PruneReport, Failure> {
    use inbox_runtime::prune::partitioned;

    let mut conn = diesel::PgConnection::establish(&options.url).map_err(Failure::Connect)?;
    let Some(count) = options.generations else {
        return batched(&mut conn, options);
    };
    let maintenance = partitioned::Maintenance::new(options.prune.policy().clone())
        .and_then(|maintenance| maintenance.generations(count))
        .map_err(|error| Failure::Usage(explain(error)))?;
    let report = maintenance.run(&mut conn)?;
    for generation in partitioned::generations(&mut conn).map_err(PruneError::from)? {
        println!("{generation}");
    }
    Ok(report)
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &Options) -> Result<PruneReport, Failure> {
    Err(Failure::Usage(
        "this build has no PostgreSQL support: run with --features postgres".to_owned(),
    ))
}

#[cfg(feature = "mysql")]
fn mysql(options: &Options) -> Result<PruneReport, Failure> {
    let mut conn = diesel::MysqlConnection::establish(&options.url).map_err(Failure::Connect)?;
    batched(&mut conn, options)
}

#[cfg(not(feature = "mysql"))]
fn mysql(_: &Options) -> Result<PruneReport, Failure> {
    Err(Failure::Usage(
        "this build has no MySQL support: run with --features mysql".to_owned(),
    ))
}

#[cfg(feature = "sqlite")]
fn sqlite(options: &Options) -> Result<PruneReport, Failure> {
    use diesel::connection::SimpleConnection;

    let mut conn = diesel::SqliteConnection::establish(&options.url).map_err(Failure::Connect)?;
    // Wait for live writers instead of failing at once.
    conn.batch_execute("PRAGMA busy_timeout = 10000")
        .map_err(|error| Failure::Prune(InboxError::from(error).into()))?;
    batched(&mut conn, options)
}

#[cfg(not(feature = "sqlite"))]
fn sqlite(_: &Options) -> Result<PruneReport, Failure> {
    Err(Failure::Usage(
        "this build has no SQLite support: use a postgres:// or mysql:// URL, or run with --features sqlite"
            .to_owned(),
    ))
}
