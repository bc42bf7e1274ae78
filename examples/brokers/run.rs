//! The driver of the `rabbitmq` and `nats` examples: a producer, a few
//! ledger consumers in this process, a little chaos, and the proof.
//!
//! 1. creates a PostgreSQL schema of the run's own (`ledger_<run>`) with the
//!    ledger's tables and the inbox's, and the run's queues or streams;
//! 2. starts the consumers (each with its own broker connection and
//!    connection pool), and publishes the [`Plan`]'s payments in waves, with
//!    producer retries and poison messages;
//! 3. meanwhile crashes consumers (their task is dropped mid-work: the
//!    broker connection closes unacknowledged, transactions in flight roll
//!    back) and restarts them, and ends a consumer's database connections
//!    (`pg_terminate_backend`);
//! 4. waits until every payment is applied or dead and the queue is empty,
//!    stops the consumers, and [`verify`]s the run; prints the summary;
//! 5. deletes the schema, queues and streams (unless `--keep`).
//!
//! The short run publishes 500 payments; `--soak [SECONDS]` (or
//! `LEDGER_SOAK_SECONDS`) keeps publishing for that long (300 s by
//! default), with a crash every 5 s, a cut every 11 s, and a progress line.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use diesel_async::AsyncPgConnection;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::check::verify;
use super::delivery::{Probe, Received, Verdict};
use super::ledger::{self, LedgerDb};
use super::plan::{Kind, Mix, Plan, Rng};
use super::{BoxError, Broker, BrokerConfig};

/// The default PostgreSQL server (the run makes a schema of its own).
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// How long a run may wait for its queue to drain before it fails.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// How often a run looks at the database and the queue while it waits.
const POLL: Duration = Duration::from_millis(50);

/// How often the soak prints its progress line.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// The command line of the examples.
#[derive(Debug, Clone)]
pub struct Options {
    /// New payments (short run; the soak publishes waves until its time is
    /// up).
    pub payments: usize,
    /// Consumers.
    pub consumers: usize,
    /// Soak for this long.
    pub soak: Option<Duration>,
    /// Keep the schema, queues and streams.
    pub keep: bool,
    /// The plan's seed.
    pub seed: u64,
}

/// The usage line.
pub const USAGE: &str =
    "usage: [--payments N] [--consumers K] [--soak [SECONDS]] [--seed S] [--keep]
  env: AMQP_URL / NATS_URL, DATABASE_URL, LEDGER_SOAK_SECONDS";

impl Options {
    /// Reads the command line (and `LEDGER_SOAK_SECONDS`).
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
        let mut options = Options {
            payments: 500,
            consumers: 3,
            soak: std::env::var("LEDGER_SOAK_SECONDS")
                .ok()
                .map(|s| s.parse().map(Duration::from_secs))
                .transpose()
                .map_err(|e| format!("LEDGER_SOAK_SECONDS: {e}"))?,
            keep: false,
            seed: Rng::seed_from_clock(),
        };
        let mut args = args.into_iter().peekable();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--payments" => options.payments = number(&mut args, &arg)? as usize,
                "--consumers" => options.consumers = number(&mut args, &arg)?.max(1) as usize,
                "--seed" => options.seed = number(&mut args, &arg)?,
                "--keep" => options.keep = true,
                "--soak" => {
                    let seconds = match args.peek() {
                        Some(next) if !next.starts_with("--") => number(&mut args, &arg)?,
                        _ => 300,
                    };
                    options.soak = Some(Duration::from_secs(seconds));
                }
                "--help" | "-h" => return Err(USAGE.into()),
                other => return Err(format!("unknown argument {other}\n{USAGE}")),
            }
        }
        Ok(options)
    }
}

fn number(args: &mut impl Iterator<Item = String>, name: &str) -> Result<u64, String> {
    let value = args.next().ok_or(format!("{name} needs a number"))?;
    value.parse().map_err(|e| format!("{name} {value}: {e}"))
}

/// What the consumers did, counted: the examples' [`Probe`].
#[derive(Debug, Default)]
pub struct Stats {
    /// Deliveries received.
    pub delivered: AtomicU64,
    /// Of which the broker flagged as delivered before.
    pub redelivered: AtomicU64,
    /// Payments applied.
    pub applied: AtomicU64,
    /// Duplicates absorbed by the inbox.
    pub duplicates: AtomicU64,
    /// Messages made dead by the handler.
    pub dead: AtomicU64,
    /// Redeliveries of dead messages, dead-lettered again.
    pub dead_again: AtomicU64,
    /// Messages without an id or a payment.
    pub unprocessable: AtomicU64,
    /// Deliveries handed back for redelivery.
    pub retries: AtomicU64,
    /// Settlements the broker did not take (the delivery comes again).
    pub unsettled: AtomicU64,
}

impl Probe for Stats {
    fn delivered(&self, delivery: &Received<'_>) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        if delivery.redelivered {
            self.redelivered.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn settled(&self, _message_id: Option<&str>, verdict: &Verdict, told: Result<(), &str>) {
        if told.is_err() {
            self.unsettled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let counter = match verdict {
            Verdict::Applied => &self.applied,
            Verdict::Duplicate => &self.duplicates,
            Verdict::Dead(_) => &self.dead,
            Verdict::DeadAgain => &self.dead_again,
            Verdict::Unprocessable(_) => &self.unprocessable,
            Verdict::Retry(_) | Verdict::InProgress(_) => &self.retries,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl Stats {
    /// One line of counts.
    pub fn line(&self) -> String {
        let n = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        format!(
            "delivered {} ({} redelivered) | applied {}, duplicates {}, dead {} (+{} again), unprocessable {}, retries {}, unsettled {}",
            n(&self.delivered),
            n(&self.redelivered),
            n(&self.applied),
            n(&self.duplicates),
            n(&self.dead),
            n(&self.dead_again),
            n(&self.unprocessable),
            n(&self.retries),
            n(&self.unsettled),
        )
    }
}

/// Runs the example on broker `B`, whose URL is in `url_variable` (else
/// `default_url`); prints the summary. Exit code 1 when the run is not
/// proven (or failed).
pub fn main<B: Broker>(url_variable: &str, default_url: &str) -> ExitCode {
    let options = match Options::from_args(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let url = std::env::var(url_variable).unwrap_or_else(|_| default_url.to_owned());
    let database_url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run::<B>(&options, &url, &database_url)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("the run failed: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run<B: Broker>(
    options: &Options,
    url: &str,
    database_url: &str,
) -> Result<bool, BoxError> {
    let started = Instant::now();
    let run = format!(
        "{}_{}",
        std::process::id(),
        Rng::seed_from_clock() % 1_000_000
    );
    let schema = format!("ledger_{run}");
    let config = BrokerConfig::new(url, &run);
    println!(
        "{}: run {run} (seed {}), {} consumers, database schema {schema}",
        B::NAME,
        options.seed,
        options.consumers
    );

    let mut admin = PgConnection::establish(database_url)?;
    admin.batch_execute(&format!("CREATE SCHEMA {schema}"))?;
    let db = LedgerDb::with_schema(database_url, &schema);
    let mix = Mix::default();
    db.prepare(mix.accounts)?;
    let producer = B::declare(&config).await?;

    let outcome = drive::<B>(options, &config, &db, &producer, &mut admin, mix, started).await;

    if options.keep {
        println!("kept: schema {schema}, the run's queues or streams");
        producer.close().await?;
    } else {
        producer.delete().await?;
        admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))?;
    }
    outcome
}

async fn drive<B: Broker>(
    options: &Options,
    config: &BrokerConfig,
    db: &LedgerDb,
    producer: &B,
    admin: &mut PgConnection,
    mix: Mix,
    started: Instant,
) -> Result<bool, BoxError> {
    let stats = Arc::new(Stats::default());
    let mut fleet = Fleet::<B>::start(options.consumers, config, db, &stats);
    let mut plan = Plan::new(&config.run, options.seed, mix);
    let mut chaos = Rng::new(options.seed ^ 0x5eed);
    let mut crashes = 0;
    let mut cuts = 0;
    let mut progress = Ticker::new(PROGRESS_EVERY);
    let mut crash_every = Ticker::new(Duration::from_secs(5));
    let mut cut_every = Ticker::new(Duration::from_secs(11));
    let counts = db.pool("ledger_progress", 1)?;

    let waves = match options.soak {
        None => 5,
        Some(_) => usize::MAX,
    };
    let per_wave = match options.soak {
        None => options.payments.div_ceil(5),
        Some(_) => 200,
    };
    let mut wave = 0;
    while wave < waves && options.soak.is_none_or(|soak| started.elapsed() < soak) {
        let batch = plan.wave(per_wave);
        let stored = producer.publish(&batch).await?;
        plan.record(&batch, &stored);
        wave += 1;
        // Chaos: in the short run a crash after the second wave and a cut
        // after the fourth; in the soak, a crash every 5 s and a cut every
        // 11 s.
        let soak = options.soak.is_some();
        if (!soak && wave == 2) || (soak && crash_every.due()) {
            fleet.crash(chaos.below(fleet.len() as u64) as usize);
            crashes += 1;
        }
        if (!soak && wave == 4) || (soak && cut_every.due()) {
            let victim = chaos.below(fleet.len() as u64) as usize;
            cut_database_connections(admin, &fleet.application_name(victim))?;
            cuts += 1;
        }
        fleet.restart_exited().await;
        if soak {
            // Keep the backlog bounded: let the consumers catch up.
            let deadline = Instant::now() + DRAIN_LIMIT;
            loop {
                let (applied, dead) = settled_counts(&counts).await?;
                if applied + dead + 400 >= (plan.count(Kind::Good) + poison(&plan)) as i64 {
                    break;
                }
                if Instant::now() > deadline {
                    return Err("the consumers fell behind for two minutes".into());
                }
                fleet.restart_exited().await;
                tokio::time::sleep(POLL).await;
            }
        }
        if progress.due() || !soak {
            println!(
                "[{:>5.1}s] published {} payments ({} copies) | {} | crashes {crashes}, db cuts {cuts} | backlog {}",
                started.elapsed().as_secs_f64(),
                plan.published().count(),
                plan.copies().0,
                stats.line(),
                producer.backlog().await?.waiting,
            );
        }
    }
    let retries = plan.last_retries();
    let stored = producer.publish(&retries).await?;
    plan.record(&retries, &stored);

    // Drain: every payment applied or dead, and the broker's queue empty.
    let deadline = Instant::now() + DRAIN_LIMIT;
    loop {
        fleet.restart_exited().await;
        let (applied, dead) = settled_counts(&counts).await?;
        let backlog = producer.backlog().await?;
        if applied == plan.count(Kind::Good) as i64
            && dead == poison(&plan) as i64
            && backlog.is_settled()
        {
            break;
        }
        if progress.due() {
            println!(
                "[{:>5.1}s] draining: applied {applied}, dead {dead} | backlog {backlog:?}",
                started.elapsed().as_secs_f64()
            );
        }
        if Instant::now() > deadline {
            println!("did not drain in {} s", DRAIN_LIMIT.as_secs());
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    fleet.stop().await;

    let dead_letter_queue = producer.dead_letters().await?;
    let left = producer.backlog().await?;
    let verification = verify(&plan, &mut db.connect()?, &dead_letter_queue, left)?;
    println!(
        "\n{} ledger run, {:.1} s: {} consumers, {crashes} crashes, {cuts} database cuts",
        B::NAME,
        started.elapsed().as_secs_f64(),
        options.consumers
    );
    println!("consumers      {}", stats.line());
    println!("{verification}");
    Ok(verification.is_ok())
}

fn poison(plan: &Plan) -> usize {
    plan.count(Kind::Rejected) + plan.count(Kind::Exhausted)
}

/// Payments applied (distinct ids with a ledger entry) and messages dead in
/// the inbox.
pub async fn settled_counts(pool: &ledger::Pool) -> Result<(i64, i64), BoxError> {
    use diesel::dsl::{count_star, sql};
    use diesel::sql_types::BigInt;
    use diesel::{ExpressionMethods, QueryDsl};
    use diesel_async::RunQueryDsl;

    let mut conn = pool.get().await?;
    let conn: &mut AsyncPgConnection = &mut conn;
    let applied = ledger::ledger_entries::table
        .select(sql::<BigInt>("count(DISTINCT message_id)"))
        .get_result(conn)
        .await?;
    let dead = ledger::inbox_failures::table
        .filter(ledger::inbox_failures::dead_at.is_not_null())
        .select(count_star())
        .get_result(conn)
        .await?;
    Ok((applied, dead))
}

/// Ends every server connection listed under `application_name`.
pub fn cut_database_connections(
    admin: &mut PgConnection,
    application_name: &str,
) -> Result<(), BoxError> {
    admin.batch_execute(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{application_name}'"
    ))?;
    Ok(())
}

/// Says when a period has passed since it last did.
struct Ticker {
    every: Duration,
    last: Instant,
}

impl Ticker {
    fn new(every: Duration) -> Self {
        Ticker {
            every,
            last: Instant::now(),
        }
    }

    fn due(&mut self) -> bool {
        let due = self.last.elapsed() >= self.every;
        if due {
            self.last = Instant::now();
        }
        due
    }
}

/// The consumers of this process: one task each, with a broker connection
/// and a connection pool of its own.
struct Fleet<B: Broker> {
    tasks: Vec<JoinHandle<Result<(), BoxError>>>,
    stop: watch::Sender<bool>,
    config: BrokerConfig,
    db: LedgerDb,
    stats: Arc<Stats>,
    _broker: std::marker::PhantomData<fn() -> B>,
}

impl<B: Broker> Fleet<B> {
    fn start(consumers: usize, config: &BrokerConfig, db: &LedgerDb, stats: &Arc<Stats>) -> Self {
        let (stop, _) = watch::channel(false);
        let mut fleet = Fleet {
            tasks: Vec::new(),
            stop,
            config: config.clone(),
            db: db.clone(),
            stats: Arc::clone(stats),
            _broker: std::marker::PhantomData,
        };
        fleet.tasks = (0..consumers).map(|i| fleet.spawn(i)).collect();
        fleet
    }

    fn len(&self) -> usize {
        self.tasks.len()
    }

    fn application_name(&self, consumer: usize) -> String {
        format!("ledger_{}_c{consumer}", self.config.run)
    }

    fn spawn(&self, consumer: usize) -> JoinHandle<Result<(), BoxError>> {
        let config = self.config.clone();
        let db = self.db.clone();
        let stats = Arc::clone(&self.stats);
        let name = self.application_name(consumer);
        let mut stop = self.stop.subscribe();
        tokio::spawn(async move {
            let broker = B::connect(&config).await?;
            let pool = db.pool(&name, usize::from(config.prefetch))?;
            let stop = async move {
                let _ = stop.wait_for(|stop| *stop).await;
            };
            broker.consume(&name, &pool, &*stats, stop).await?;
            broker.close().await
        })
    }

    /// Drops consumer `consumer` wherever it is, and starts a new one.
    fn crash(&mut self, consumer: usize) {
        self.tasks[consumer].abort();
        self.tasks[consumer] = self.spawn(consumer);
    }

    /// Restarts the consumers that ended by themselves (a lost broker
    /// connection), saying why.
    async fn restart_exited(&mut self) {
        for consumer in 0..self.tasks.len() {
            if self.tasks[consumer].is_finished() {
                let ended = self.spawn(consumer);
                let ended = std::mem::replace(&mut self.tasks[consumer], ended);
                match ended.await {
                    Ok(Ok(())) => eprintln!("consumer {consumer} stopped; restarted"),
                    Ok(Err(error)) => eprintln!("consumer {consumer} failed: {error}; restarted"),
                    Err(error) => eprintln!("consumer {consumer} ended: {error}; restarted"),
                }
            }
        }
    }

    /// Stops every consumer: each settles what it holds, then closes.
    async fn stop(self) {
        let _ = self.stop.send(true);
        for (consumer, task) in self.tasks.into_iter().enumerate() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => eprintln!("consumer {consumer} failed while stopping: {error}"),
                Err(error) => eprintln!("consumer {consumer} ended: {error}"),
            }
        }
    }
}
