//! The chaos run, written once for both brokers: consumer processes, the
//! kills, the drain, the proof and the report.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::marker::PhantomData;
use std::process::Stdio;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use inbox_examples::brokers::check::{Verification, verify};
use inbox_examples::brokers::ledger::{LedgerDb, Pool};
use inbox_examples::brokers::plan::{Kind, Mix, Plan, Rng};
use inbox_examples::brokers::run::settled_counts;
use inbox_examples::brokers::{Broker, BrokerConfig};
use inbox_tests::{Postgres, SqlRows, TestBackend};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// A broker the chaos run can target.
pub trait Target: Broker {
    /// The consumer binary's name for it.
    const CLI: &'static str;
    /// The environment variable with its URL.
    const URL_VARIABLE: &'static str;
    /// Its URL when the variable is not set.
    const DEFAULT_URL: &'static str;
}

/// One step of the chaos: a wave of payments, and what happens to a
/// consumer while it is consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    /// SIGKILL inside the handler's transaction.
    KillInTransaction,
    /// SIGKILL after the handler committed, before the ack.
    KillAfterCommit,
    /// SIGKILL at a random moment while the wave is consumed.
    KillAtRandom,
    /// SIGKILL when everything published so far is settled (no wave).
    KillIdle,
    /// `pg_terminate_backend` on the consumer's connections while it is
    /// inside a transaction; the process lives on.
    CutDatabase,
}

impl Step {
    fn name(self) -> &'static str {
        match self {
            Step::KillInTransaction => "mid-transaction",
            Step::KillAfterCommit => "after commit, before ack",
            Step::KillAtRandom => "at a random moment",
            Step::KillIdle => "idle",
            Step::CutDatabase => "database connections cut",
        }
    }
}

/// What a chaos run does.
pub struct Scenario {
    /// Consumer processes.
    pub consumers: usize,
    /// New payments per wave.
    pub payments_per_wave: usize,
    /// The steps, in order.
    pub steps: &'static [Step],
    /// JetStream's `ack_wait`.
    pub ack_wait: Duration,
    /// The whole run's limit: past it, the test fails.
    pub limit: Duration,
}

/// The short run of the CI: three consumers, eight waves, eight kills of
/// every kind and one cut connection.
pub const SHORT: Scenario = Scenario {
    consumers: 3,
    payments_per_wave: 40,
    steps: &[
        Step::KillInTransaction,
        Step::KillAfterCommit,
        Step::CutDatabase,
        Step::KillAtRandom,
        Step::KillAfterCommit,
        Step::KillInTransaction,
        Step::KillAtRandom,
        Step::KillAfterCommit,
        Step::KillIdle,
    ],
    ack_wait: Duration::from_secs(2),
    limit: Duration::from_secs(150),
};

/// The mix of the runs: more poison than the examples', so that every run
/// has some of each kind, and a slow payment per wave published as a storm
/// of copies: its body holds the transaction 4.5 s, longer than the
/// consumers' claim wait and than JetStream's `ack_wait`, so copies arrive
/// (RabbitMQ: the storm; JetStream: its redelivery after `ack_wait`) while
/// the first delivery runs, and are answered "in progress". JetStream
/// redelivers up to a second after `ack_wait` (2 s) on a loaded machine, and
/// the copy's claim waits 500 ms more: 4.5 s leaves room for both.
const MIX: Mix = Mix {
    accounts: 10,
    late_retry_percent: 15,
    early_retry_percent: 5,
    rejected_percent: 4,
    exhausted_percent: 4,
    missing_ids_per_wave: 1,
    slow_per_wave: 1,
    slow_hold_ms: 4_500,
    storm_copies: 3,
};

/// Runs `scenario` on broker `B`: skips (with a `skipped:` line) when
/// PostgreSQL or the broker cannot be reached, unless they are required.
pub fn run<B: Target>(scenario: &Scenario) {
    let Some(db) = Postgres::open() else { return };
    let url = std::env::var(B::URL_VARIABLE).unwrap_or_else(|_| B::DEFAULT_URL.to_owned());
    let runtime = inbox_tests::runtime::multi_thread(2);
    runtime.block_on(async {
        let run = inbox_tests::unique_name("chaos");
        let config = BrokerConfig {
            // Two deliveries at a time, two connections per process: each
            // restart opens its connections anew, and a SCRAM handshake
            // costs ~250 ms of CPU in a debug build.
            prefetch: 2,
            ack_wait: scenario.ack_wait,
            max_deliver: 20,
            duplicate_window: Duration::from_secs(1),
            ..BrokerConfig::new(&url, &run)
        };
        let producer = match B::declare(&config).await {
            Ok(producer) => producer,
            Err(error) => {
                inbox_tests::report_unavailable_broker(B::NAME, &url, &error);
                return;
            }
        };
        let mut cleanup = Cleanup::<B>::new(&config);
        let ledger = LedgerDb::new(db.url());
        ledger.prepare(MIX.accounts).expect("create the ledger");
        let mut chaos = Chaos::<B>::new(scenario, &config, &ledger, &db, producer);
        chaos.perform().await;
        chaos.finish().await;
        cleanup.disarm();
    });
}

/// A chaos run in progress.
struct Chaos<'a, B: Target> {
    scenario: &'a Scenario,
    started: Instant,
    deadline: Instant,
    seed: u64,
    rng: Rng,
    plan: Plan,
    producer: Option<B>,
    fleet: Fleet,
    admin: PgConnection,
    counts: Pool,
    kills: BTreeMap<Step, u32>,
    /// Deliveries killed after their commit: the id, what the handler
    /// decided, and the killed process.
    killed_after_commit: Vec<(String, String, u32)>,
    /// How long each step took, and the drain.
    timeline: Vec<(&'static str, Duration)>,
}

impl<'a, B: Target> Chaos<'a, B> {
    fn new(
        scenario: &'a Scenario,
        config: &BrokerConfig,
        ledger: &LedgerDb,
        db: &Postgres,
        producer: B,
    ) -> Self {
        let seed = std::env::var("INBOX_CHAOS_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(Rng::seed_from_clock);
        let started = Instant::now();
        Chaos {
            scenario,
            started,
            deadline: started + scenario.limit,
            seed,
            rng: Rng::new(seed),
            plan: Plan::new(&config.run, seed, MIX),
            producer: Some(producer),
            fleet: Fleet::new(B::CLI, config, ledger.url()),
            admin: db.connect(),
            counts: ledger.pool("chaos_counts", 1).expect("a pool"),
            kills: BTreeMap::new(),
            killed_after_commit: Vec::new(),
            timeline: Vec::new(),
        }
    }

    fn producer(&self) -> &B {
        self.producer.as_ref().expect("the producer is open")
    }

    async fn publish_wave(&mut self) {
        let wave = self.plan.wave(self.scenario.payments_per_wave);
        self.publish(wave).await;
    }

    async fn publish(&mut self, batch: Vec<inbox_examples::brokers::Outgoing>) {
        let stored = self.producer().publish(&batch).await.expect("publish");
        self.plan.record(&batch, &stored);
    }

    /// Starts the consumers and goes through the steps.
    async fn perform(&mut self) {
        let start = Instant::now();
        for slot in 0..self.scenario.consumers {
            self.fleet.spawn(slot, self.deadline).await;
        }
        self.timeline.push(("start", start.elapsed()));
        for (number, &step) in self.scenario.steps.iter().enumerate() {
            let start = Instant::now();
            let slot = number % self.scenario.consumers;
            self.fleet.restart_exited(self.deadline).await;
            match step {
                Step::KillInTransaction => self.kill_in_transaction(slot).await,
                Step::KillAfterCommit => self.kill_after_commit(slot).await,
                Step::KillAtRandom => self.kill_at_random().await,
                Step::KillIdle => self.kill_idle().await,
                Step::CutDatabase => self.cut_database(slot).await,
            }
            if step != Step::CutDatabase {
                *self.kills.entry(step).or_default() += 1;
            }
            self.timeline.push((step.name(), start.elapsed()));
        }
    }

    /// Publishes waves until the consumer in `slot` reports `prefix` (it
    /// paused where it was told to): a wave can go entirely to the other
    /// consumers (the broker hands messages to whoever has room), so one
    /// more is published every two seconds. Fails the test at the deadline.
    async fn publish_until_paused(&mut self, slot: usize, what: &str, prefix: &str) -> Event {
        let pid = self.fleet.pid(slot);
        let wanted = |event: &Event| event.pid == pid && event.line.starts_with(prefix);
        loop {
            self.publish_wave().await;
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left <= Duration::from_secs(2) {
                return self.fleet.wait_for(self.deadline, what, wanted).await;
            }
            if let Some(event) = self.fleet.pump_until(Duration::from_secs(2), wanted).await {
                return event;
            }
        }
    }

    async fn kill_in_transaction(&mut self, slot: usize) {
        self.fleet.command(slot, "pause transaction").await;
        let paused = self
            .publish_until_paused(
                slot,
                "a pause inside the transaction",
                "paused transaction ",
            )
            .await;
        let name = self.fleet.name(slot);
        let in_transaction = self.admin.bigint(&format!(
            "SELECT count(*) AS value FROM pg_stat_activity \
             WHERE application_name = '{name}' AND state = 'idle in transaction'"
        ));
        assert!(
            in_transaction >= 1,
            "{}: consumer {name} paused ({}) but no connection of its is idle in a transaction",
            B::NAME,
            paused.line
        );
        self.fleet.kill(slot).await;
        self.fleet.spawn(slot, self.deadline).await;
    }

    async fn kill_after_commit(&mut self, slot: usize) {
        self.fleet.command(slot, "pause settle").await;
        let pid = self.fleet.pid(slot);
        let paused = self
            .publish_until_paused(slot, "a pause after the commit", "paused settle ")
            .await;
        let mut words = paused.line.split(' ').skip(2);
        let id = words.next().expect("an id").to_owned();
        let verdict = words.next().expect("a verdict").to_owned();
        self.fleet.kill(slot).await;
        self.killed_after_commit.push((id, verdict, pid));
        self.fleet.spawn(slot, self.deadline).await;
    }

    async fn kill_at_random(&mut self) {
        self.publish_wave().await;
        let slot = self.rng.below(self.scenario.consumers as u64) as usize;
        // The moment is random; the wave keeps the consumers busy meanwhile.
        let moment = Duration::from_millis(self.rng.below(300));
        self.fleet.pump(moment).await;
        self.fleet.kill(slot).await;
        self.fleet.spawn(slot, self.deadline).await;
    }

    async fn kill_idle(&mut self) {
        self.wait_until_settled("everything published so far settled")
            .await;
        let slot = self.rng.below(self.scenario.consumers as u64) as usize;
        let pid = self.fleet.pid(slot);
        assert!(
            self.fleet.tally.holds(pid) == 0,
            "consumer {} holds deliveries although everything is settled",
            self.fleet.name(slot)
        );
        self.fleet.kill(slot).await;
        self.fleet.spawn(slot, self.deadline).await;
    }

    async fn cut_database(&mut self, slot: usize) {
        self.fleet.command(slot, "pause transaction").await;
        let paused = self
            .publish_until_paused(
                slot,
                "a pause inside the transaction",
                "paused transaction ",
            )
            .await;
        let id = paused.line["paused transaction ".len()..].to_owned();
        let pid = self.fleet.pid(slot);
        let name = self.fleet.name(slot);
        let backends = self.admin.bigints(&format!(
            "SELECT pid::bigint AS value FROM pg_stat_activity WHERE application_name = '{name}'"
        ));
        assert!(!backends.is_empty(), "consumer {name} has no connection");
        for backend in backends {
            inbox_tests::terminate::<Postgres>(&mut self.admin, backend);
        }
        let since = self.fleet.log.len();
        self.fleet.command(slot, "resume").await;
        // The paused delivery fails on its dead connection: not committed,
        // so it is handed back for redelivery.
        let retried = format!("settled {id} retry");
        self.fleet
            .wait_for(self.deadline, "the cut delivery retried", |event| {
                event.pid == pid && event.line == retried
            })
            .await;
        // And the same process applies payments again, on new connections.
        let applied = |event: &Event| event.pid == pid && event.line.ends_with(" applied");
        let mut recovered = self.fleet.log[since..].iter().any(applied);
        for _ in 0..3 {
            if recovered {
                break;
            }
            recovered = self
                .fleet
                .pump_until(Duration::from_secs(5), applied)
                .await
                .is_some();
            if !recovered {
                self.publish_wave().await;
            }
        }
        assert!(
            recovered,
            "consumer {name} applied nothing after its connections were cut (events since: {:?})",
            &self.fleet.log[since..]
        );
        *self.kills.entry(Step::CutDatabase).or_default() += 1;
    }

    /// Waits until every payment published so far is applied or dead, the
    /// broker holds nothing, and no consumer holds a delivery.
    async fn wait_until_settled(&mut self, what: &str) {
        loop {
            self.fleet.restart_exited(self.deadline).await;
            let (applied, dead) = settled_counts(&self.counts).await.expect("count");
            let good = self.plan.count(Kind::Good) as i64;
            let poison =
                (self.plan.count(Kind::Rejected) + self.plan.count(Kind::Exhausted)) as i64;
            let backlog = self.producer().backlog().await.expect("backlog");
            if applied == good && dead == poison && backlog.is_settled() && self.fleet.idle() {
                return;
            }
            assert!(
                Instant::now() < self.deadline,
                "{}: not settled after {} s ({what}): applied {applied} of {good}, dead {dead} of {poison}, {backlog:?}, consumers holding {:?}",
                B::NAME,
                self.scenario.limit.as_secs(),
                self.fleet.holding()
            );
            // Re-check after the next settlement (or 100 ms).
            self.fleet
                .pump_until(Duration::from_millis(100), |event| {
                    event.line.starts_with("settled ")
                })
                .await;
        }
    }

    /// The producer's last retries, the drain, the stop, the proof and the
    /// report.
    async fn finish(mut self) {
        let start = Instant::now();
        // Kills can hit every slow payment before its copy arrives (fast
        // steps, on JetStream whose duplicate window drops the storm's
        // copies): one more wave, with its slow payment, unkilled, so the
        // in-progress answer is always exercised.
        if self.fleet.tally.verdict("in-progress") == 0 {
            self.publish_wave().await;
            self.wait_until_settled("a slow payment without kills")
                .await;
        }
        let retries = self.plan.last_retries();
        self.publish(retries).await;
        // A replay of every poison message, long after the first copies
        // died: each copy must be dead-lettered again, not acknowledged.
        let replay = self.plan.republish(&[Kind::Rejected, Kind::Exhausted]);
        self.publish(replay).await;
        self.wait_until_settled("the drain").await;
        self.fleet.stop_all(self.deadline).await;
        self.timeline.push(("drain and stop", start.elapsed()));

        let producer = self.producer.take().expect("the producer is open");
        let dead_letter_queue = producer
            .dead_letters()
            .await
            .expect("read the dead letters");
        let left = producer.backlog().await.expect("backlog");
        let mut ledger = self.admin;
        let verification =
            verify(&self.plan, &mut ledger, &dead_letter_queue, left).expect("check the ledger");
        let absorbed: Vec<String> = self
            .killed_after_commit
            .iter()
            .filter(|(id, verdict, killed)| !self.fleet.absorbed_elsewhere(id, verdict, *killed))
            .map(|(id, verdict, _)| format!("{id} ({verdict})"))
            .collect();

        let report = report::<B>(
            self.scenario,
            self.seed,
            self.started.elapsed(),
            &self.kills,
            &self.fleet.tally,
            &self.timeline,
            &verification,
        );
        let _ = writeln!(std::io::stderr().lock(), "{report}");

        assert!(
            verification.is_ok(),
            "{}: the ledger is not as published (seed {}):\n{verification}",
            B::NAME,
            self.seed
        );
        assert!(
            self.fleet.tally.unexpected_exits.is_empty(),
            "{}: consumers exited by themselves: {:?}",
            B::NAME,
            self.fleet.tally.unexpected_exits
        );
        assert!(
            absorbed.is_empty(),
            "{}: deliveries killed after their commit were not redelivered and absorbed: {absorbed:?}",
            B::NAME
        );
        let planned =
            |step: Step| self.scenario.steps.iter().filter(|s| **s == step).count() as u32;
        for step in [
            Step::KillInTransaction,
            Step::KillAfterCommit,
            Step::KillAtRandom,
            Step::KillIdle,
            Step::CutDatabase,
        ] {
            assert_eq!(
                self.kills.get(&step).copied().unwrap_or(0),
                planned(step),
                "{}: {} performed",
                B::NAME,
                step.name()
            );
        }
        let tally = &self.fleet.tally;
        assert!(
            tally.redelivered >= self.killed_after_commit.len() as u64,
            "{}: fewer redeliveries ({}) than kills after a commit ({})",
            B::NAME,
            tally.redelivered,
            self.killed_after_commit.len()
        );
        assert!(
            tally.verdict("duplicate") > 0 && tally.verdict("dead-again") > 0,
            "{}: the inbox absorbed no duplicate, or no copy of a dead message",
            B::NAME
        );
        assert!(
            tally.verdict("in-progress") > 0,
            "{}: no copy of a slow payment arrived while it ran (in progress)",
            B::NAME
        );
        producer
            .delete()
            .await
            .expect("delete the run's queues or streams");
    }
}

fn report<B: Target>(
    scenario: &Scenario,
    seed: u64,
    took: Duration,
    kills: &BTreeMap<Step, u32>,
    tally: &Tally,
    timeline: &[(&'static str, Duration)],
    verification: &Verification,
) -> String {
    let mut report = String::new();
    let _ = writeln!(
        report,
        "chaos on {}: {} consumer processes, {} steps, {:.1} s (INBOX_CHAOS_SEED={seed})",
        B::NAME,
        scenario.consumers,
        scenario.steps.len(),
        took.as_secs_f64()
    );
    let kill_list: Vec<String> = kills
        .iter()
        .filter(|(step, _)| **step != Step::CutDatabase)
        .map(|(step, n)| format!("{n} {}", step.name()))
        .collect();
    let total: u32 = kills
        .iter()
        .filter(|(step, _)| **step != Step::CutDatabase)
        .map(|(_, n)| n)
        .sum();
    let _ = writeln!(
        report,
        "kills          {total} SIGKILLs: {}; {} database cut(s), recovered",
        kill_list.join(", "),
        kills.get(&Step::CutDatabase).copied().unwrap_or(0)
    );
    let _ = writeln!(
        report,
        "consumers      {} deliveries, {} redeliveries observed; {} applied, {} duplicates absorbed, {} dead, {} dead again, {} without id, {} retries, {} in progress, {} unsettled",
        tally.delivered,
        tally.redelivered,
        tally.verdict("applied"),
        tally.verdict("duplicate"),
        tally.verdict("dead"),
        tally.verdict("dead-again"),
        tally.verdict("unprocessable"),
        tally.verdict("retry"),
        tally.verdict("in-progress"),
        tally.unsettled
    );
    let steps: Vec<String> = timeline
        .iter()
        .map(|(what, took)| format!("{what} {:.1} s", took.as_secs_f64()))
        .collect();
    let _ = writeln!(report, "timeline       {}", steps.join(", "));
    let _ = write!(report, "{verification}");
    report
}

/// Deletes the run's queues or streams if the test did not get to (a
/// failed assertion).
struct Cleanup<B: Broker> {
    config: Option<BrokerConfig>,
    broker: PhantomData<fn() -> B>,
}

impl<B: Broker> Cleanup<B> {
    fn new(config: &BrokerConfig) -> Self {
        Cleanup {
            config: Some(config.clone()),
            broker: PhantomData,
        }
    }

    fn disarm(&mut self) {
        self.config = None;
    }
}

impl<B: Broker> Drop for Cleanup<B> {
    fn drop(&mut self) {
        let Some(config) = self.config.take() else {
            return;
        };
        // A runtime of its own, on a thread of its own: this may run while
        // the test's runtime unwinds.
        let _ = std::thread::spawn(move || {
            inbox_tests::runtime::current_thread().block_on(async {
                if let Ok(broker) = B::connect(&config).await {
                    let _ = broker.delete().await;
                }
            })
        })
        .join();
    }
}

/// One line a consumer printed (`line` empty and `exited` set: its stdout
/// closed).
#[derive(Debug, Clone)]
struct Event {
    pid: u32,
    line: String,
    exited: bool,
}

/// What the consumers said, counted.
#[derive(Debug, Default)]
struct Tally {
    delivered: u64,
    redelivered: u64,
    verdicts: HashMap<String, u64>,
    unsettled: u64,
    /// Deliveries received minus deliveries settled, per process.
    holding: HashMap<u32, i64>,
    unexpected_exits: Vec<String>,
}

impl Tally {
    fn record(&mut self, event: &Event) {
        let mut words = event.line.split(' ');
        match words.next() {
            Some("delivered") => {
                self.delivered += 1;
                if words.nth(1) == Some("1") {
                    self.redelivered += 1;
                }
                *self.holding.entry(event.pid).or_default() += 1;
            }
            Some("settled") => {
                let verdict = words.nth(1).unwrap_or("?").to_owned();
                if words.next() == Some("unsettled") {
                    self.unsettled += 1;
                } else {
                    *self.verdicts.entry(verdict).or_default() += 1;
                }
                *self.holding.entry(event.pid).or_default() -= 1;
            }
            _ => {}
        }
    }

    fn verdict(&self, kind: &str) -> u64 {
        self.verdicts.get(kind).copied().unwrap_or(0)
    }

    fn holds(&self, pid: u32) -> i64 {
        self.holding.get(&pid).copied().unwrap_or(0)
    }
}

/// A consumer process.
struct Process {
    child: Child,
    stdin: ChildStdin,
    pid: u32,
    name: String,
}

/// The consumer processes, their events and what they said.
struct Fleet {
    broker: &'static str,
    config: BrokerConfig,
    database_url: String,
    slots: Vec<Option<Process>>,
    spawned: usize,
    sender: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    /// Every event, in order.
    log: Vec<Event>,
    tally: Tally,
    /// Processes the test killed or stopped.
    ended: HashSet<u32>,
    /// `INBOX_CHAOS_TRACE=1`: print every event, timed from `born`.
    trace: bool,
    born: Instant,
}

impl Fleet {
    fn new(broker: &'static str, config: &BrokerConfig, database_url: &str) -> Self {
        let (sender, events) = mpsc::unbounded_channel();
        Fleet {
            broker,
            config: config.clone(),
            database_url: database_url.to_owned(),
            slots: Vec::new(),
            spawned: 0,
            sender,
            events,
            log: Vec::new(),
            tally: Tally::default(),
            ended: HashSet::new(),
            trace: std::env::var("INBOX_CHAOS_TRACE").is_ok_and(|v| v == "1"),
            born: Instant::now(),
        }
    }

    fn process(&self, slot: usize) -> &Process {
        self.slots[slot].as_ref().expect("a running consumer")
    }

    fn pid(&self, slot: usize) -> u32 {
        self.process(slot).pid
    }

    fn name(&self, slot: usize) -> String {
        self.process(slot).name.clone()
    }

    /// Starts a consumer process in `slot` and waits until it is
    /// subscribed.
    async fn spawn(&mut self, slot: usize, deadline: Instant) {
        let name = format!("{}_c{slot}_{}", self.config.run, self.spawned);
        self.spawned += 1;
        let mut child = Command::new(env!("CARGO_BIN_EXE_chaos-consumer"))
            .args([
                self.broker,
                &self.config.url,
                &self.config.run,
                &self.config.prefetch.to_string(),
                &self.database_url,
                &name,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start a consumer process");
        let pid = child.id().expect("a running process");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take().expect("piped stdin");
        let sender = self.sender.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = sender.send(Event {
                    pid,
                    line,
                    exited: false,
                });
            }
            let _ = sender.send(Event {
                pid,
                line: String::new(),
                exited: true,
            });
        });
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        self.slots[slot] = Some(Process {
            child,
            stdin,
            pid,
            name,
        });
        self.wait_for(deadline, "a consumer subscribed", |event| {
            event.pid == pid && event.line == "ready"
        })
        .await;
    }

    /// Sends `command` to the consumer in `slot`.
    async fn command(&mut self, slot: usize, command: &str) {
        let process = self.slots[slot].as_mut().expect("a running consumer");
        process
            .stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to a consumer");
        process.stdin.flush().await.expect("flush");
    }

    /// SIGKILLs the consumer in `slot` and waits for its end.
    async fn kill(&mut self, slot: usize) {
        let mut process = self.slots[slot].take().expect("a running consumer");
        self.ended.insert(process.pid);
        process.child.start_kill().expect("SIGKILL");
        process
            .child
            .wait()
            .await
            .expect("wait for the killed consumer");
        self.tally.holding.remove(&process.pid);
    }

    /// Tells every consumer to stop, and waits until each has settled what
    /// it held and exited with success.
    async fn stop_all(&mut self, deadline: Instant) {
        let mut running = HashSet::new();
        for slot in 0..self.slots.len() {
            self.command(slot, "stop").await;
            let pid = self.pid(slot);
            self.ended.insert(pid);
            running.insert(pid);
        }
        self.wait_for(deadline, "every consumer stopped", |event| {
            if event.line == "stopped" {
                running.remove(&event.pid);
            }
            running.is_empty()
        })
        .await;
        for slot in 0..self.slots.len() {
            let mut process = self.slots[slot].take().expect("a running consumer");
            let status = process.child.wait().await.expect("wait for a consumer");
            assert!(
                status.success(),
                "consumer {} exited with {status}",
                process.name
            );
        }
    }

    /// Restarts the consumers that exited by themselves (recorded as
    /// unexpected).
    async fn restart_exited(&mut self, deadline: Instant) {
        self.pump(Duration::ZERO).await;
        for slot in 0..self.slots.len() {
            let exited = match self.slots[slot].as_mut() {
                Some(process) => process.child.try_wait().expect("try_wait").is_some(),
                None => true,
            };
            if exited {
                if let Some(mut process) = self.slots[slot].take() {
                    let status = process.child.wait().await.expect("wait");
                    self.tally
                        .unexpected_exits
                        .push(format!("{} ({status})", process.name));
                }
                self.spawn(slot, deadline).await;
            }
        }
    }

    /// Whether no consumer holds a delivery.
    fn idle(&self) -> bool {
        self.slots
            .iter()
            .flatten()
            .all(|process| self.tally.holds(process.pid) == 0)
    }

    /// What each consumer holds.
    fn holding(&self) -> Vec<(String, i64)> {
        self.slots
            .iter()
            .flatten()
            .map(|process| (process.name.clone(), self.tally.holds(process.pid)))
            .collect()
    }

    fn record(&mut self, event: Event) -> Event {
        if self.trace {
            let _ = writeln!(
                std::io::stderr().lock(),
                "chaos {:>7.3} {} {}",
                self.born.elapsed().as_secs_f64(),
                event.pid,
                if event.exited {
                    "(exited)"
                } else {
                    &event.line
                }
            );
        }
        self.tally.record(&event);
        if event.exited && !self.ended.contains(&event.pid) {
            // Its slot is restarted by `restart_exited`.
            let _ = writeln!(
                std::io::stderr().lock(),
                "chaos: consumer process {} exited by itself",
                event.pid
            );
        }
        self.log.push(event.clone());
        event
    }

    /// Takes events for `period`.
    async fn pump(&mut self, period: Duration) {
        let until = Instant::now() + period;
        loop {
            match self.events.try_recv() {
                Ok(event) => {
                    self.record(event);
                    continue;
                }
                Err(_) if Instant::now() >= until => return,
                Err(_) => {}
            }
            let left = until.saturating_duration_since(Instant::now());
            if let Ok(Some(event)) = tokio::time::timeout(left, self.events.recv()).await {
                self.record(event);
            }
        }
    }

    /// Takes events until one matches `wanted` (returned) or `period`
    /// passes (`None`).
    async fn pump_until(
        &mut self,
        period: Duration,
        mut wanted: impl FnMut(&Event) -> bool,
    ) -> Option<Event> {
        let until = Instant::now() + period;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.events.recv()).await {
                Ok(Some(event)) => {
                    let event = self.record(event);
                    if wanted(&event) {
                        return Some(event);
                    }
                }
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// Takes events until one matches `wanted`; fails the test at
    /// `deadline`.
    async fn wait_for(
        &mut self,
        deadline: Instant,
        what: &str,
        wanted: impl FnMut(&Event) -> bool,
    ) -> Event {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.pump_until(left, wanted).await {
            Some(event) => event,
            None => panic!(
                "chaos: no {what} before the deadline; last events: {:?}",
                &self.log[self.log.len().saturating_sub(20)..]
            ),
        }
    }

    /// Whether message `id`, whose delivery process `killed` held (killed
    /// after the commit, with `verdict`), was delivered again to another
    /// process and absorbed there (a duplicate, or dead again). On
    /// JetStream that may happen before the kill: a delivery held past
    /// `ack_wait` is redelivered meanwhile.
    fn absorbed_elsewhere(&self, id: &str, verdict: &str, killed: u32) -> bool {
        let absorbed = match verdict {
            "applied" => "duplicate",
            _ => "dead-again",
        };
        let redelivered = format!("delivered {id} 1");
        let settled = format!("settled {id} {absorbed}");
        let elsewhere = || self.log.iter().filter(|event| event.pid != killed);
        elsewhere().any(|event| event.line == redelivered)
            && elsewhere().any(|event| event.line == settled)
    }
}
