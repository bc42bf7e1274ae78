//! Two services, exactly once hop by hop, on a real NATS JetStream and
//! PostgreSQL. Service A applies payments (`ledger::apply_payment`: the
//! inbox, the ledger, and a receipt recorded through the outbox in the same
//! transaction), each delivered once or twice, some of them rejected, some
//! first delivered by a future dropped partway;
//! three relay processes of A publish the receipts to JetStream; two
//! processes of service B record them, each with its own inbox
//! (`outbox-hop`). Meanwhile the test SIGKILLs relays at random moments and
//! between the broker's confirmation and their mark, SIGKILLs B's
//! processes, and cuts B's database connections.
//!
//! Proven at the end: every applied payment has exactly one receipt in A's
//! outbox and exactly one receipt recorded by B (none lost, none doubled),
//! with its account and amount; a rejected payment has none (no ghost);
//! nothing is left pending or dead in the outbox. The stream's duplicate
//! window is short (200 ms), so a relay's re-publish after its lease
//! reaches B, whose inbox absorbs it: the report counts the re-publishes
//! and B's duplicates.
//!
//! A suite of its own, so that its processes never share the CPUs with the
//! ledger chaos runs of `tests/brokers/` (whose timing checks they would
//! disturb). Needs NATS with JetStream (`INBOX_TEST_NATS_URL`, default
//! `nats://127.0.0.1:4222`) and PostgreSQL; an unreachable broker skips
//! the test, or fails it with `INBOX_TEST_REQUIRE_BROKERS=1`.
//!
//! Run: `cargo test -p inbox-tests --features brokers,outbox-brokers --test outbox_hop -- --nocapture`
#![cfg(all(feature = "brokers", feature = "outbox-brokers"))]
#![allow(missing_docs)]

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use inbox_examples::brokers::check::receipts;
use inbox_examples::brokers::ledger::{self, LedgerDb, Payment, PaymentBody};
use inbox_runtime::AckDecision;
use inbox_tests::{Postgres, SqlRows, TestBackend};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

const ACCOUNTS: i64 = 5;
const GOOD: usize = 240;
const REJECTED: usize = 20;
const RELAYS: usize = 3;
const RECEIVERS: usize = 2;
/// The chaos lasts at least this long, and until A has applied every payment.
const CHAOS: Duration = Duration::from_secs(8);
/// The pause between two waves of four payments: 65 waves over about the
/// chaos's length.
const PACE: Duration = Duration::from_millis(100);
/// The end of the run, chaos and drain: a failure, not a hang.
const LIMIT: Duration = Duration::from_secs(150);

fn nats_url() -> String {
    std::env::var("INBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

#[test]
fn a_payment_chain_is_exactly_once_hop_by_hop() {
    let Some(db) = Postgres::open() else { return };
    inbox_tests::runtime::multi_thread(2).block_on(run(db));
}

async fn run(db: Postgres) {
    let url = nats_url();
    let client = match async_nats::connect(&url).await {
        Ok(client) => client,
        Err(error) => return inbox_tests::report_unavailable_broker("NATS", &url, &error),
    };
    let js = jetstream::new(client);
    let run = inbox_tests::unique_name("hop");
    let stream_name = format!("{run}_receipts");
    js.create_stream(stream::Config {
        name: stream_name.clone(),
        subjects: vec![format!("{run}.>")],
        duplicate_window: Duration::from_millis(200),
        ..Default::default()
    })
    .await
    .expect("create the receipts stream");
    let ledger = LedgerDb::new(db.url());
    ledger.prepare(ACCOUNTS).expect("create the ledger");
    let mut admin = db.connect();
    diesel::connection::SimpleConnection::batch_execute(
        &mut admin,
        "CREATE TABLE hop_receipts (id BIGSERIAL PRIMARY KEY, payment TEXT NOT NULL, \
         account BIGINT NOT NULL, cents BIGINT NOT NULL)",
    )
    .unwrap();

    let deadline = Instant::now() + LIMIT;
    let mut fleet = Fleet::new(&ledger, &url, &run, &stream_name);
    for slot in 0..RELAYS {
        fleet.spawn(Role::Relay, slot, deadline).await;
    }
    for slot in 0..RECEIVERS {
        fleet.spawn(Role::Receipts, slot, deadline).await;
    }

    // Service A applies the payments while the chaos goes on.
    let pool = ledger.pool("hop_a", 4).expect("a pool");
    let payments = tokio::spawn(async move {
        let mut next = 0;
        let mut in_progress = 0;
        while next < GOOD + REJECTED {
            let mut wave = Vec::new();
            for _ in 0..4 {
                if next < GOOD + REJECTED {
                    wave.push(payment(next));
                    next += 1;
                }
            }
            let mut tasks = Vec::new();
            for payment in wave {
                let pool = pool.clone();
                tasks.push(tokio::spawn(async move {
                    // Every seventh payment's first delivery is cancelled
                    // partway (its future dropped: a consumer shut down
                    // mid-delivery): its transaction, receipt included,
                    // rolls back, or it committed. Then it is delivered
                    // once or twice more.
                    let number: usize = payment.id["pay-".len()..].parse().expect("a number");
                    if number % 7 == 0 {
                        let mut conn = pool.get().await.expect("a connection");
                        let cut = Duration::from_micros(200 + 300 * (number as u64 % 10));
                        let _ = tokio::time::timeout(
                            cut,
                            ledger::apply_payment(&mut conn, &payment, &()),
                        )
                        .await;
                    }
                    let copies = 1 + number % 2;
                    let mut later = 0;
                    for _ in 0..copies {
                        loop {
                            let mut conn = pool.get().await.expect("a connection");
                            let result = ledger::apply_payment(&mut conn, &payment, &()).await;
                            match (inbox_runtime::ack_decision(&result), result) {
                                (_, Ok(_)) => break,
                                (_, Err(_)) if payment.body.account > ACCOUNTS => break,
                                // The cancelled delivery's transaction is
                                // still open on the server: redeliver later.
                                (AckDecision::RetryLater, Err(_)) => {
                                    later += 1;
                                    tokio::time::sleep(Duration::from_millis(300)).await;
                                }
                                (_, Err(error)) => panic!("{}: {error}", payment.id),
                            }
                        }
                    }
                    later
                }));
            }
            for task in tasks {
                in_progress += task.await.expect("a payment task");
            }
            // Spread over the chaos: the relays have work while they die.
            tokio::time::sleep(PACE).await;
        }
        in_progress
    });

    let chaos_ends = Instant::now() + CHAOS;
    let mut rng = inbox_examples::brokers::plan::Rng::new(
        inbox_examples::brokers::plan::Rng::seed_from_clock(),
    );
    while Instant::now() < chaos_ends || !payments.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the chaos did not end: {}",
            fleet.tally()
        );
        match rng.below(4) {
            0 => {
                let slot = rng.below(RELAYS as u64) as usize;
                fleet.kill(Role::Relay, slot).await;
                fleet.kills_at_random += 1;
                fleet.spawn(Role::Relay, slot, deadline).await;
            }
            1 => {
                let slot = rng.below(RELAYS as u64) as usize;
                fleet.kill_holding(slot, deadline).await;
            }
            2 => {
                let slot = rng.below(RECEIVERS as u64) as usize;
                fleet.kill(Role::Receipts, slot).await;
                fleet.receiver_kills += 1;
                fleet.spawn(Role::Receipts, slot, deadline).await;
            }
            _ => {
                let slot = rng.below(RECEIVERS as u64) as usize;
                let name = fleet.name(Role::Receipts, slot);
                fleet.cuts += admin.bigint(&format!(
                    "SELECT count(pg_terminate_backend(pid)) AS value FROM pg_stat_activity \
                     WHERE application_name = '{name}'"
                ));
            }
        }
        fleet
            .pump(Duration::from_millis(300 + rng.below(300)))
            .await;
    }
    let in_progress = payments.await.expect("the payments");

    // The drain: the relays publish what is left, B records it.
    let recorded_sql = "SELECT count(DISTINCT payment) AS value FROM hop_receipts";
    let pending_sql = "SELECT count(*) AS value FROM inbox_outbox WHERE sent_at IS NULL";
    let drain = Instant::now();
    while admin.bigint(pending_sql) > 0 || admin.bigint(recorded_sql) < GOOD as i64 {
        assert!(
            Instant::now() < deadline,
            "not drained: {} pending in the outbox, {} of {GOOD} receipts recorded; {}",
            admin.bigint(pending_sql),
            admin.bigint(recorded_sql),
            fleet.tally()
        );
        fleet.pump(Duration::from_millis(100)).await;
    }
    let drained_in = drain.elapsed();
    // Copies still in flight (a re-publish, a redelivery) settle.
    fleet.pump(Duration::from_secs(3)).await;

    // Service A: one ledger entry and one receipt in its outbox per good
    // payment, none for a rejected one; nothing dead.
    let outbox = receipts(&mut admin).expect("read A's receipts");
    let mut entries: BTreeMap<String, usize> = BTreeMap::new();
    for id in admin.texts("SELECT message_id AS value FROM ledger_entries") {
        *entries.entry(id).or_default() += 1;
    }
    let mut problems = Vec::new();
    for n in 0..GOOD + REJECTED {
        let payment = payment(n);
        let expected = usize::from(payment.body.account <= ACCOUNTS);
        let found = outbox.get(&payment.id).map_or(0, Vec::len);
        if found != expected {
            problems.push(format!("A's outbox: {} has {found} receipts", payment.id));
        }
        let found = entries.get(&payment.id).copied().unwrap_or(0);
        if found != expected {
            problems.push(format!("A's ledger: {} has {found} entries", payment.id));
        }
    }
    let dead = admin.bigint("SELECT count(*) AS value FROM inbox_outbox WHERE dead_at IS NOT NULL");
    if dead > 0 {
        problems.push(format!("{dead} receipts dead in A's outbox"));
    }

    // Service B: one recorded receipt per applied payment, as A sent it.
    let rows = admin.texts("SELECT payment AS value FROM hop_receipts");
    let mut recorded: BTreeMap<String, usize> = BTreeMap::new();
    for payment in &rows {
        *recorded.entry(payment.clone()).or_default() += 1;
    }
    for n in 0..GOOD + REJECTED {
        let payment = payment(n);
        let found = recorded.remove(&payment.id).unwrap_or(0);
        let expected = usize::from(payment.body.account <= ACCOUNTS);
        if found != expected {
            problems.push(format!("B recorded {} {found} times", payment.id));
        }
    }
    problems.extend(recorded.keys().map(|id| format!("B recorded unknown {id}")));
    let wrong_amounts = admin.bigint(
        "SELECT count(*) AS value FROM hop_receipts r JOIN ledger_entries e \
         ON e.message_id = r.payment WHERE e.account_id <> r.account OR e.amount_cents <> r.cents",
    );
    if wrong_amounts > 0 {
        problems.push(format!(
            "{wrong_amounts} receipts with another account or amount"
        ));
    }

    let stored = js
        .get_stream(&stream_name)
        .await
        .expect("the stream")
        .get_info()
        .await
        .expect("its info")
        .state
        .messages;
    let report = format!(
        "outbox hop: {GOOD} payments applied by A (and {REJECTED} rejected; {} copies answered \
         in progress after a cancelled delivery), {} receipts in A's outbox, {} recorded by B; \
         drained in {:.1} s\n\
         chaos: {} relay kills at random, {} between confirm and mark, {} B kills, {} B \
         connections cut\n\
         copies: {stored} receipts stored by JetStream ({} re-published past the duplicate \
         window), {} absorbed by B's inbox as duplicates\n{}",
        in_progress,
        outbox.values().map(Vec::len).sum::<usize>(),
        rows.len(),
        drained_in.as_secs_f64(),
        fleet.kills_at_random,
        fleet.kills_holding,
        fleet.receiver_kills,
        fleet.cuts,
        stored.saturating_sub(GOOD as u64),
        fleet.duplicates(),
        if problems.is_empty() {
            "check: OK, every receipt once in A's outbox and once in B, none for a rejected payment"
                .to_owned()
        } else {
            problems.join("\n")
        }
    );
    let _ = writeln!(std::io::stderr().lock(), "{report}");
    fleet.stop_all().await;
    let _ = js.delete_stream(&stream_name).await;
    assert!(problems.is_empty(), "{report}");
    assert!(
        fleet.kills_holding > 0,
        "no relay was killed between confirm and mark: {report}"
    );
}

/// Payment `n`: good ones to accounts 1..=ACCOUNTS, every 13th to an
/// account that does not exist (rejected) until `REJECTED` of them.
fn payment(n: usize) -> Payment {
    let rejected = n >= GOOD;
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Role {
    Relay,
    Receipts,
}

struct Process {
    child: Child,
    stdin: ChildStdin,
    pid: u32,
    name: String,
}

/// The relay and receipts processes, and what they said.
struct Fleet {
    database: LedgerDb,
    nats_url: String,
    run: String,
    stream: String,
    processes: HashMap<(Role, usize), Process>,
    spawned: usize,
    sender: mpsc::UnboundedSender<(u32, String)>,
    lines: mpsc::UnboundedReceiver<(u32, String)>,
    said: Vec<(u32, String)>,
    kills_at_random: u32,
    kills_holding: u32,
    receiver_kills: u32,
    cuts: i64,
}

impl Fleet {
    fn new(ledger: &LedgerDb, nats_url: &str, run: &str, stream: &str) -> Fleet {
        let (sender, lines) = mpsc::unbounded_channel();
        Fleet {
            database: LedgerDb::new(ledger.url()),
            nats_url: nats_url.to_owned(),
            run: run.to_owned(),
            stream: stream.to_owned(),
            processes: HashMap::new(),
            spawned: 0,
            sender,
            lines,
            said: Vec::new(),
            kills_at_random: 0,
            kills_holding: 0,
            receiver_kills: 0,
            cuts: 0,
        }
    }

    fn name(&self, role: Role, slot: usize) -> String {
        self.processes[&(role, slot)].name.clone()
    }

    async fn spawn(&mut self, role: Role, slot: usize, deadline: Instant) {
        let (mode, last) = match role {
            Role::Relay => ("relay", &self.run),
            Role::Receipts => ("receipts", &self.stream),
        };
        let name = format!("{}_{mode}{slot}_{}", self.run, self.spawned);
        self.spawned += 1;
        let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-hop"))
            .args([mode, &self.database.tagged_url(&name), &self.nats_url, last])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start an outbox-hop process");
        let pid = child.id().expect("a running process");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take().expect("piped stdin");
        let sender = self.sender.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = sender.send((pid, line));
            }
        });
        self.processes.insert(
            (role, slot),
            Process {
                child,
                stdin,
                pid,
                name,
            },
        );
        self.wait_for(deadline, |said| said.0 == pid && said.1 == "ready")
            .await
            .unwrap_or_else(|| panic!("{mode} process {slot} never got ready"));
    }

    async fn kill(&mut self, role: Role, slot: usize) {
        let mut process = self.processes.remove(&(role, slot)).expect("a process");
        process.child.start_kill().expect("SIGKILL");
        process
            .child
            .wait()
            .await
            .expect("wait for the killed process");
    }

    /// Tells relay `slot` to hold its next confirmed batch, and kills it
    /// there (between the broker's confirmation and the mark); if it has
    /// nothing to publish within 3 s, kills it anyway.
    async fn kill_holding(&mut self, slot: usize, deadline: Instant) {
        let process = self
            .processes
            .get_mut(&(Role::Relay, slot))
            .expect("a relay");
        let pid = process.pid;
        process
            .stdin
            .write_all(b"hold\n")
            .await
            .expect("tell the relay");
        process.stdin.flush().await.expect("flush");
        let held = self
            .wait_for(Instant::now() + Duration::from_secs(3), |said| {
                said.0 == pid && said.1.starts_with("holding ")
            })
            .await;
        self.kill(Role::Relay, slot).await;
        match held {
            Some(_) => self.kills_holding += 1,
            None => self.kills_at_random += 1,
        }
        self.spawn(Role::Relay, slot, deadline).await;
    }

    /// Collects what the processes say for `time`.
    async fn pump(&mut self, time: Duration) {
        let until = tokio::time::Instant::now() + time;
        while let Ok(Some(said)) = tokio::time::timeout_at(until, self.lines.recv()).await {
            self.said.push(said);
        }
    }

    /// Collects what the processes say until `wanted` (its line), or
    /// `None` at `deadline`.
    async fn wait_for(
        &mut self,
        deadline: Instant,
        wanted: impl Fn(&(u32, String)) -> bool,
    ) -> Option<(u32, String)> {
        let until = tokio::time::Instant::from_std(deadline);
        while let Ok(Some(said)) = tokio::time::timeout_at(until, self.lines.recv()).await {
            let found = wanted(&said);
            self.said.push(said.clone());
            if found {
                return Some(said);
            }
        }
        None
    }

    /// Receipts B's inbox answered as duplicates.
    fn duplicates(&self) -> usize {
        self.said
            .iter()
            .filter(|(_, line)| line.starts_with("recorded ") && line.ends_with(" duplicate"))
            .count()
    }

    fn tally(&self) -> String {
        format!(
            "{} relay kills at random, {} holding, {} B kills, {} lines said",
            self.kills_at_random,
            self.kills_holding,
            self.receiver_kills,
            self.said.len()
        )
    }

    async fn stop_all(&mut self) {
        let keys: Vec<(Role, usize)> = self.processes.keys().copied().collect();
        for (role, slot) in keys {
            self.kill(role, slot).await;
        }
    }
}
