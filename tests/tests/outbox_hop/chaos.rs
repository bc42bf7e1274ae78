//! The run, written once for the outbox and its mutants: the brokers, the
//! processes, the steps of the chaos, the drain, the check and the report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use diesel::PgConnection;
use inbox_examples::brokers::ledger::{self, LedgerDb, Payment, PaymentBody};
use inbox_examples::brokers::plan::Rng;
use inbox_examples::brokers::rabbitmq::{self, RabbitMq};
use inbox_examples::brokers::{Broker, BrokerConfig, Outgoing};
use inbox_tests::{Postgres, SqlRows, TestBackend};

use crate::check::{Findings, check};
use crate::fleet::{Event, Fleet, Role, Setup, Tally};
use inbox_test_servers::NatsServer;

/// Accounts `1..=ACCOUNTS` exist; a payment to another is rejected.
pub const ACCOUNTS: i64 = 5;

/// The name of B's durable consumer (`outbox-hop receipts`).
const RECEIVERS_CONSUMER: &str = "receipts";

/// One step of the chaos. Each step publishes a wave of payments first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    /// SIGKILL one of A's consumers at a random moment while the wave is
    /// consumed.
    ConsumerAtRandom,
    /// SIGKILL one of A's consumers inside the handler's transaction (after
    /// the balance update and the receipt, before the ledger entry).
    ConsumerMidBody,
    /// SIGKILL one of A's consumers after the handler applied a payment,
    /// before the ack: the redelivery must be absorbed as a duplicate.
    ConsumerAfterCommit,
    /// SIGKILL one of A's relays at a random moment.
    RelayAtRandom,
    /// SIGKILL one of A's relays between the broker's confirmation of a
    /// batch and its mark.
    RelayHolding,
    /// SIGKILL one of B's processes at a random moment.
    ReceiverAtRandom,
    /// `pg_terminate_backend` on every session of A's consumers and relays,
    /// while a consumer is inside a transaction (its delivery is retried).
    CutA,
    /// `pg_terminate_backend` on the sessions of one of B's processes.
    CutB,
    /// SIGKILL the receipts' JetStream server; payments go on meanwhile; start
    /// it again on the same port and store.
    RestartBroker,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::ConsumerAtRandom => "A consumer killed at random",
            Step::ConsumerMidBody => "A consumer killed mid-body",
            Step::ConsumerAfterCommit => "A consumer killed between commit and ack",
            Step::RelayAtRandom => "relay killed at random",
            Step::RelayHolding => "relay killed between confirm and mark",
            Step::ReceiverAtRandom => "B killed at random",
            Step::CutA => "A's connections cut",
            Step::CutB => "B's connections cut",
            Step::RestartBroker => "JetStream restarted",
        }
    }
}

/// What a run does.
pub struct Scenario {
    /// `None`: A records its receipts through the outbox (the product);
    /// else the `--mutation` of A's consumers.
    pub mutation: Option<&'static str>,
    pub consumers: usize,
    pub relays: usize,
    pub receivers: usize,
    /// New payments per wave.
    pub wave: usize,
    /// The steps; in this order unless `shuffle`.
    pub steps: &'static [Step],
    pub shuffle: bool,
    /// The whole run's limit: past it, the test fails.
    pub limit: Duration,
}

/// What a run did and found.
pub struct Run {
    pub findings: Findings,
    pub report: String,
    pub kills: BTreeMap<Step, u32>,
    pub tally: Tally,
    /// Payments whose delivery was killed between commit and ack, and
    /// those of them whose redelivery no other consumer absorbed as a
    /// duplicate.
    pub killed_after_commit: Vec<String>,
    pub not_absorbed: Vec<String>,
    /// Payments whose delivery was killed inside its transaction.
    pub killed_mid_body: Vec<String>,
    /// The rejected payments published.
    pub rejected: Vec<String>,
}

/// Payment `n`: one in 13 to an account that does not exist (rejected),
/// the others to accounts `1..=ACCOUNTS`.
pub fn payment(n: usize) -> Payment {
    let rejected = n % 13 == 6;
    Payment {
        id: format!("pay-{n}"),
        body: PaymentBody {
            account: if rejected {
                999
            } else {
                1 + (n as i64) % ACCOUNTS
            },
            amount_cents: 100 + n as i64,
            currency: ledger::LEDGER_CURRENCY.to_owned(),
            hold_ms: 0,
        },
    }
}

/// Runs `scenario`; `None` (after a `skipped:` line) when PostgreSQL,
/// RabbitMQ or a `nats-server` binary is missing and not required.
pub fn run(scenario: &Scenario) -> Option<Run> {
    let db = Postgres::open()?;
    inbox_tests::runtime::multi_thread(2).block_on(async {
        let amqp_url = std::env::var("INBOX_TEST_AMQP_URL")
            .unwrap_or_else(|_| rabbitmq::DEFAULT_URL.to_owned());
        let run = inbox_tests::unique_name("hop");
        let config = BrokerConfig::new(&amqp_url, &run);
        let producer = match RabbitMq::declare(&config).await {
            Ok(producer) => producer,
            Err(error) => {
                inbox_tests::report_unavailable_broker("RabbitMQ", &amqp_url, &error);
                return None;
            }
        };
        let _queues = DeleteQueues(Some(config));
        let nats = match tokio::task::spawn_blocking(NatsServer::start)
            .await
            .expect("start NATS")
        {
            Ok(nats) => nats,
            Err(error) => {
                inbox_tests::report_unavailable_broker(
                    "a throwaway nats-server with JetStream",
                    "nats://127.0.0.1",
                    &error,
                );
                return None;
            }
        };
        let client = async_nats::connect(nats.url())
            .await
            .expect("connect to the throwaway NATS server");
        let js = jetstream::new(client);
        let stream = format!("{run}_receipts");
        js.create_stream(stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{run}.>")],
            // Short: a stalled relay's re-publish reaches B.
            duplicate_window: Duration::from_millis(200),
            ..Default::default()
        })
        .await
        .expect("create the receipts stream");

        let database = LedgerDb::new(db.url());
        database.prepare(ACCOUNTS).expect("create the ledger");
        let mut admin = db.connect();
        diesel::connection::SimpleConnection::batch_execute(
            &mut admin,
            "CREATE TABLE hop_receipts (id BIGSERIAL PRIMARY KEY, payment TEXT NOT NULL, \
             account BIGINT NOT NULL, cents BIGINT NOT NULL)",
        )
        .expect("create B's table");
        let fleet = Fleet::new(Setup {
            database,
            amqp_url,
            nats_url: nats.url(),
            run,
            stream: stream.clone(),
            mutation: scenario.mutation,
        });
        let mut chaos = Chaos::new(scenario, producer, nats, js, stream, fleet, admin);
        chaos.perform().await;
        let drained_in = chaos.drain().await;
        Some(chaos.finish(drained_in).await)
    })
}

/// A run in progress.
struct Chaos<'a> {
    scenario: &'a Scenario,
    started: Instant,
    deadline: Instant,
    seed: u64,
    rng: Rng,
    producer: RabbitMq,
    nats: NatsServer,
    js: jetstream::Context,
    stream: String,
    fleet: Fleet,
    admin: PgConnection,
    /// The next payment's number; the payments published (once each); the
    /// previous wave's payments to publish again; copies published again.
    next: usize,
    published: Vec<Payment>,
    again: Vec<Payment>,
    copies: usize,
    kills: BTreeMap<Step, u32>,
    cut_a: i64,
    cut_b: i64,
    /// How long JetStream was down, in all.
    outage: Duration,
    killed_after_commit: Vec<(String, u32)>,
    killed_mid_body: Vec<String>,
}

impl<'a> Chaos<'a> {
    fn new(
        scenario: &'a Scenario,
        producer: RabbitMq,
        nats: NatsServer,
        js: jetstream::Context,
        stream: String,
        fleet: Fleet,
        admin: PgConnection,
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
            producer,
            nats,
            js,
            stream,
            fleet,
            admin,
            next: 0,
            published: Vec::new(),
            again: Vec::new(),
            copies: 0,
            kills: BTreeMap::new(),
            cut_a: 0,
            cut_b: 0,
            outage: Duration::ZERO,
            killed_after_commit: Vec::new(),
            killed_mid_body: Vec::new(),
        }
    }

    /// Publishes the previous wave's odd payments again (a producer's
    /// retry: duplicates for A's inbox) and a wave of new payments.
    async fn publish_wave(&mut self) {
        let mut batch: Vec<Payment> = std::mem::take(&mut self.again);
        self.copies += batch.len();
        for _ in 0..self.scenario.wave {
            let payment = payment(self.next);
            if self.next % 2 == 1 {
                self.again.push(payment.clone());
            }
            self.next += 1;
            self.published.push(payment.clone());
            batch.push(payment);
        }
        self.publish(&batch).await;
    }

    async fn publish(&mut self, batch: &[Payment]) {
        let outgoing: Vec<Outgoing> = batch
            .iter()
            .map(|payment| Outgoing {
                id: Some(payment.id.clone()),
                body: payment.body.encode(),
            })
            .collect();
        self.producer
            .publish(&outgoing)
            .await
            .expect("publish payments to RabbitMQ");
    }

    fn slot(&mut self, of: usize) -> usize {
        self.rng.below(of as u64) as usize
    }

    /// Starts the processes and goes through the steps.
    async fn perform(&mut self) {
        for slot in 0..self.scenario.receivers {
            self.fleet.spawn(Role::Receiver, slot, self.deadline).await;
        }
        for slot in 0..self.scenario.relays {
            self.fleet.spawn(Role::Relay, slot, self.deadline).await;
        }
        for slot in 0..self.scenario.consumers {
            self.fleet.spawn(Role::Consumer, slot, self.deadline).await;
        }
        let mut steps = self.scenario.steps.to_vec();
        if self.scenario.shuffle {
            for i in (1..steps.len()).rev() {
                let j = self.rng.below(i as u64 + 1) as usize;
                steps.swap(i, j);
            }
        }
        for step in steps {
            self.fleet.restart_exited(self.deadline).await;
            self.publish_wave().await;
            match step {
                Step::ConsumerAtRandom => self.kill_at_random(Role::Consumer).await,
                Step::ConsumerMidBody => self.kill_mid_body().await,
                Step::ConsumerAfterCommit => self.kill_after_commit().await,
                Step::RelayAtRandom => self.kill_at_random(Role::Relay).await,
                Step::RelayHolding => self.kill_holding().await,
                Step::ReceiverAtRandom => self.kill_at_random(Role::Receiver).await,
                Step::CutA => self.cut_a().await,
                Step::CutB => self.cut_b().await,
                Step::RestartBroker => self.restart_broker().await,
            }
            *self.kills.entry(step).or_default() += 1;
            let pause = Duration::from_millis(100 + self.rng.below(300));
            self.fleet.pump(pause).await;
        }
    }

    fn count(&self, role: Role) -> usize {
        match role {
            Role::Consumer => self.scenario.consumers,
            Role::Relay => self.scenario.relays,
            Role::Receiver => self.scenario.receivers,
        }
    }

    /// Publishes a wave every 1.5 s until the process in `slot` of `role`
    /// says a line starting with `prefix` (a wave may go to the others).
    async fn publish_until(&mut self, role: Role, slot: usize, what: &str, prefix: &str) -> Event {
        let pid = self.fleet.pid(role, slot);
        let wanted = |event: &Event| event.pid == pid && event.line.starts_with(prefix);
        loop {
            let said = self
                .fleet
                .pump_until(Duration::from_millis(1500), |event| wanted(event))
                .await;
            if let Some(event) = said {
                return event;
            }
            assert!(
                Instant::now() < self.deadline,
                "outbox hop: no {what} before the deadline; last events: {:?}",
                &self.fleet.log[self.fleet.log.len().saturating_sub(20)..]
            );
            self.publish_wave().await;
        }
    }

    async fn kill_at_random(&mut self, role: Role) {
        let slot = self.slot(self.count(role));
        let moment = Duration::from_millis(self.rng.below(300));
        self.fleet.pump(moment).await;
        self.fleet.kill(role, slot).await;
        self.fleet.spawn(role, slot, self.deadline).await;
    }

    async fn kill_mid_body(&mut self) {
        let slot = self.slot(self.scenario.consumers);
        self.fleet
            .command(Role::Consumer, slot, "pause transaction")
            .await;
        let paused = self
            .publish_until(
                Role::Consumer,
                slot,
                "pause inside a transaction",
                "paused transaction ",
            )
            .await;
        let id = paused.line["paused transaction ".len()..].to_owned();
        let name = self.fleet.name(Role::Consumer, slot);
        let open = self.admin.bigint(&format!(
            "SELECT count(*) AS value FROM pg_stat_activity \
             WHERE application_name = '{name}' AND state = 'idle in transaction'"
        ));
        assert!(
            open >= 1,
            "consumer {name} paused in {id}'s transaction, but no session of its is in one"
        );
        self.fleet.kill(Role::Consumer, slot).await;
        self.killed_mid_body.push(id);
        self.fleet.spawn(Role::Consumer, slot, self.deadline).await;
    }

    async fn kill_after_commit(&mut self) {
        let slot = self.slot(self.scenario.consumers);
        let pid = self.fleet.pid(Role::Consumer, slot);
        self.fleet
            .command(Role::Consumer, slot, "pause settle")
            .await;
        let paused = self
            .publish_until(
                Role::Consumer,
                slot,
                "pause after a commit",
                "paused settle ",
            )
            .await;
        let id = paused.line.split(' ').nth(2).expect("an id").to_owned();
        self.fleet.kill(Role::Consumer, slot).await;
        self.killed_after_commit.push((id, pid));
        self.fleet.spawn(Role::Consumer, slot, self.deadline).await;
    }

    async fn kill_holding(&mut self) {
        let slot = self.slot(self.scenario.relays);
        self.fleet.command(Role::Relay, slot, "hold").await;
        self.publish_until(
            Role::Relay,
            slot,
            "relay holding a confirmed batch",
            "holding ",
        )
        .await;
        // Stalled past JetStream's duplicate window, then killed: its
        // messages are taken over at once (the round's locks go with its
        // connection), and the re-publish reaches B's inbox.
        tokio::time::sleep(Duration::from_millis(400)).await;
        self.fleet.kill(Role::Relay, slot).await;
        self.fleet.spawn(Role::Relay, slot, self.deadline).await;
    }

    /// Terminates every session of A's consumers and relays while a
    /// consumer is inside a transaction, which must then be retried.
    async fn cut_a(&mut self) {
        let slot = self.slot(self.scenario.consumers);
        let pid = self.fleet.pid(Role::Consumer, slot);
        self.fleet
            .command(Role::Consumer, slot, "pause transaction")
            .await;
        let paused = self
            .publish_until(
                Role::Consumer,
                slot,
                "pause inside a transaction",
                "paused transaction ",
            )
            .await;
        let id = paused.line["paused transaction ".len()..].to_owned();
        let consumers = self.fleet.names_of(Role::Consumer);
        let relays = self.fleet.names_of(Role::Relay);
        self.cut_a += self.admin.bigint(&format!(
            "SELECT count(pg_terminate_backend(pid)) AS value FROM pg_stat_activity \
             WHERE starts_with(application_name, '{consumers}') \
             OR starts_with(application_name, '{relays}')"
        ));
        self.fleet.command(Role::Consumer, slot, "resume").await;
        let retried = format!("settled {id} retry");
        self.fleet
            .wait_for(self.deadline, "retry of the cut delivery", |event| {
                event.pid == pid && event.line == retried
            })
            .await;
    }

    async fn cut_b(&mut self) {
        let slot = self.slot(self.scenario.receivers);
        let name = self.fleet.name(Role::Receiver, slot);
        self.cut_b += self.admin.bigint(&format!(
            "SELECT count(pg_terminate_backend(pid)) AS value FROM pg_stat_activity \
             WHERE application_name = '{name}'"
        ));
    }

    /// SIGKILLs the JetStream server; while it is down, A applies two
    /// waves of payments and records their receipts, which the relays
    /// cannot publish; then starts it again on the same port and store.
    async fn restart_broker(&mut self) {
        let down = Instant::now();
        self.nats.kill();
        self.fleet.pump(Duration::from_millis(300)).await;
        self.publish_wave().await;
        self.fleet.pump(Duration::from_millis(700)).await;
        self.publish_wave().await;
        self.fleet.pump(Duration::from_millis(700)).await;
        if let Err(error) = tokio::task::block_in_place(|| self.nats.restart()) {
            panic!("outbox hop: JetStream did not come back: {error}");
        }
        self.outage += down.elapsed();
        // The stream is back (the test's client reconnected).
        loop {
            let back =
                tokio::time::timeout(Duration::from_secs(1), self.js.get_stream(&self.stream))
                    .await;
            if matches!(back, Ok(Ok(_))) {
                break;
            }
            assert!(
                Instant::now() < self.deadline,
                "outbox hop: the receipts stream is not back after the restart:{}",
                self.nats.log_tail()
            );
            self.fleet.pump(Duration::from_millis(100)).await;
        }
    }

    /// Whether everything is settled: every good payment applied, nothing
    /// waiting in RabbitMQ or held by a consumer, nothing pending in the
    /// outbox, every receipt stored by JetStream acknowledged by B.
    async fn settled(&mut self) -> Result<(), String> {
        let good = self
            .published
            .iter()
            .filter(|payment| payment.body.account <= ACCOUNTS)
            .count() as i64;
        let applied = self
            .admin
            .bigint("SELECT count(DISTINCT message_id) AS value FROM ledger_entries");
        let pending = self.admin.bigint(
            "SELECT count(*) AS value FROM inbox_outbox WHERE sent_at IS NULL AND dead_at IS NULL",
        );
        let waiting = self
            .producer
            .backlog()
            .await
            .map_err(|error| format!("RabbitMQ backlog: {error}"))?
            .waiting;
        let receipts = tokio::time::timeout(Duration::from_secs(2), async {
            self.js
                .get_stream(&self.stream)
                .await?
                .consumer_info(RECEIVERS_CONSUMER)
                .await
                .map_err(async_nats::Error::from)
        })
        .await
        .map_err(|_| "B's consumer info: timed out".to_owned())?
        .map_err(|error| format!("B's consumer info: {error}"))?;
        let state = format!(
            "{applied} of {good} good payments applied, {waiting} waiting in RabbitMQ, \
             consumers idle: {}, {pending} receipts pending in the outbox, B: {} to deliver \
             and {} unacknowledged",
            self.fleet.idle(),
            receipts.num_pending,
            receipts.num_ack_pending
        );
        if applied == good
            && waiting == 0
            && self.fleet.idle()
            && pending == 0
            && receipts.num_pending == 0
            && receipts.num_ack_pending == 0
        {
            Ok(())
        } else {
            Err(state)
        }
    }

    /// Publishes the last copies, then waits until everything is settled
    /// twice in a row, 300 ms apart. How long it took.
    async fn drain(&mut self) -> Duration {
        let again = std::mem::take(&mut self.again);
        self.copies += again.len();
        self.publish(&again).await;
        let start = Instant::now();
        let mut settled_in_a_row = 0;
        while settled_in_a_row < 2 {
            self.fleet.restart_exited(self.deadline).await;
            match self.settled().await {
                Ok(()) => settled_in_a_row += 1,
                Err(state) => {
                    settled_in_a_row = 0;
                    assert!(
                        Instant::now() < self.deadline,
                        "outbox hop: not drained after {} s: {state}",
                        self.scenario.limit.as_secs()
                    );
                }
            }
            self.fleet.pump(Duration::from_millis(300)).await;
        }
        start.elapsed()
    }

    async fn finish(mut self, drained_in: Duration) -> Run {
        self.fleet.kill_all().await;
        let stored = self
            .js
            .get_stream(&self.stream)
            .await
            .expect("the receipts stream")
            .get_info()
            .await
            .expect("its info")
            .state
            .messages;
        let findings = check(
            &mut self.admin,
            &self.published,
            self.scenario.mutation.is_none(),
        );
        let not_absorbed: Vec<String> = self
            .killed_after_commit
            .iter()
            .filter(|(id, killed)| !self.fleet.absorbed_elsewhere(id, *killed))
            .map(|(id, _)| id.clone())
            .collect();
        let report = self.report(&findings, stored, drained_in, not_absorbed.len());
        let _ = writeln!(std::io::stderr().lock(), "{report}");
        let rejected = self
            .published
            .iter()
            .filter(|payment| payment.body.account > ACCOUNTS)
            .map(|payment| payment.id.clone())
            .collect();
        Run {
            findings,
            report,
            kills: self.kills,
            tally: std::mem::take(&mut self.fleet.tally),
            killed_after_commit: self
                .killed_after_commit
                .into_iter()
                .map(|(id, _)| id)
                .collect(),
            not_absorbed,
            killed_mid_body: self.killed_mid_body,
            rejected,
        }
    }

    fn report(
        &self,
        findings: &Findings,
        stored: u64,
        drained_in: Duration,
        not_absorbed: usize,
    ) -> String {
        let scenario = self.scenario;
        let tally = &self.fleet.tally;
        let kills = |step: Step| self.kills.get(&step).copied().unwrap_or(0);
        let rejected = self
            .published
            .iter()
            .filter(|payment| payment.body.account > ACCOUNTS)
            .count();
        let mut report = String::new();
        let _ = writeln!(
            report,
            "outbox hop, A {}: {} consumers, {} relays, {} B processes; {} steps in {:.1} s \
             (INBOX_CHAOS_SEED={})",
            scenario.mutation.map_or_else(
                || "through the outbox".to_owned(),
                |mutation| format!("MUTATED ({mutation})")
            ),
            scenario.consumers,
            scenario.relays,
            scenario.receivers,
            scenario.steps.len(),
            self.started.elapsed().as_secs_f64(),
            self.seed
        );
        let _ = writeln!(
            report,
            "payments   {} published to RabbitMQ ({} good, {rejected} rejected), {} copies \
             published again; A: {} deliveries ({} redelivered): {} applied, {} duplicates \
             absorbed, {} dead, {} retried, {} in progress, {} unsettled",
            self.published.len(),
            self.published.len() - rejected,
            self.copies,
            tally.delivered,
            tally.redelivered,
            tally.verdict("applied"),
            tally.verdict("duplicate"),
            tally.verdict("dead"),
            tally.verdict("retry"),
            tally.verdict("in-progress"),
            tally.unsettled
        );
        let _ = writeln!(
            report,
            "kills      A's consumers: {} at random, {} mid-body, {} between commit and ack \
             ({} of whose redeliveries absorbed as duplicates); relays: {} at random, {} between \
             confirm and mark; B: {} at random; {} exited by themselves",
            kills(Step::ConsumerAtRandom),
            kills(Step::ConsumerMidBody),
            kills(Step::ConsumerAfterCommit),
            self.killed_after_commit.len() - not_absorbed,
            kills(Step::RelayAtRandom),
            kills(Step::RelayHolding),
            kills(Step::ReceiverAtRandom),
            tally.unexpected_exits.len()
        );
        let _ = writeln!(
            report,
            "broker     {} JetStream restarts (SIGKILL, {:.1} s down in all, same port and \
             store): {} relay rounds backed off (broker unavailable), {} with refusals; B's \
             deliveries or pulls failed {} times",
            kills(Step::RestartBroker),
            self.outage.as_secs_f64(),
            tally.rounds_unavailable,
            tally.rounds_refused,
            tally.receiver_trouble
        );
        let _ = writeln!(
            report,
            "cuts       {} sessions of A's consumers and relays ({} cuts, {} relay rounds failed \
             on the database), {} of B's ({} cuts)",
            self.cut_a,
            kills(Step::CutA),
            tally.rounds_failed,
            self.cut_b,
            kills(Step::CutB)
        );
        let sent = if scenario.mutation.is_none() {
            format!(
                "{} in A's outbox; {stored} stored by JetStream ({} re-published past the \
                 duplicate window)",
                findings.in_outbox,
                stored.saturating_sub(findings.in_outbox as u64)
            )
        } else {
            format!(
                "{} in A's outbox, {} published by A's consumers themselves; {stored} stored by \
                 JetStream",
                findings.in_outbox, tally.published_directly
            )
        };
        let _ = writeln!(
            report,
            "receipts   {sent}; {} recorded by B, {} absorbed by B's inbox as duplicates",
            findings.recorded, tally.recorded_duplicates
        );
        let _ = writeln!(
            report,
            "drain      {:.1} s after the last step",
            drained_in.as_secs_f64()
        );
        if !tally.round_reasons.is_empty() {
            let _ = writeln!(
                report,
                "relays     first rounds that did not go through: {}",
                tally.round_reasons.join(" | ")
            );
        }
        let _ = write!(report, "{findings}");
        report
    }
}

/// Deletes the run's RabbitMQ queues and exchange at the end, whatever
/// happened.
struct DeleteQueues(Option<BrokerConfig>);

impl Drop for DeleteQueues {
    fn drop(&mut self) {
        let Some(config) = self.0.take() else { return };
        // A runtime of its own, on a thread of its own: this runs inside the
        // test's runtime (which may be unwinding).
        let _ = std::thread::spawn(move || {
            inbox_tests::runtime::current_thread().block_on(async {
                if let Ok(broker) = RabbitMq::connect(&config).await {
                    let _ = broker.delete().await;
                }
            })
        })
        .join();
    }
}
