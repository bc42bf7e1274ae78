//! The processes of a run (the `outbox-hop` binary): A's consumers, A's
//! relays, B's receivers; what they say, counted.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use inbox_examples::brokers::ledger::LedgerDb;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// What a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Service A's payment consumer.
    Consumer,
    /// Service A's outbox relay.
    Relay,
    /// Service B's receipts consumer.
    Receiver,
}

impl Role {
    fn mode(self) -> &'static str {
        match self {
            Role::Consumer => "consumer",
            Role::Relay => "relay",
            Role::Receiver => "receipts",
        }
    }
}

/// One line a process printed (`exited`: its stdout closed).
#[derive(Debug, Clone)]
pub struct Event {
    pub pid: u32,
    pub role: Role,
    pub line: String,
    pub exited: bool,
}

/// What the processes said, counted.
#[derive(Debug, Default)]
pub struct Tally {
    /// Deliveries A's consumers received, and of them redeliveries.
    pub delivered: u64,
    pub redelivered: u64,
    /// A's verdicts (`applied`, `duplicate`, `dead`, `retry`,
    /// `in-progress`), settled with the broker.
    pub verdicts: HashMap<String, u64>,
    /// Deliveries whose settlement failed.
    pub unsettled: u64,
    /// Receipts a mutant published itself.
    pub published_directly: u64,
    /// Relay rounds: the broker could not take them (the relay backed off),
    /// it refused messages, the database failed.
    pub rounds_unavailable: u64,
    pub rounds_refused: u64,
    pub rounds_failed: u64,
    /// The first reasons the relays gave for rounds that did not go
    /// through.
    pub round_reasons: Vec<String>,
    /// Receipts B recorded, and of them duplicates its inbox absorbed.
    pub recorded: u64,
    pub recorded_duplicates: u64,
    /// Deliveries B failed, and pulls that broke (the broker restarting).
    pub receiver_trouble: u64,
    /// Deliveries received minus deliveries settled, per consumer process.
    holding: HashMap<u32, i64>,
    /// Processes that exited by themselves.
    pub unexpected_exits: Vec<String>,
}

impl Tally {
    fn record(&mut self, event: &Event) {
        let mut words = event.line.split(' ');
        match (event.role, words.next()) {
            (Role::Consumer, Some("delivered")) => {
                self.delivered += 1;
                if words.nth(1) == Some("1") {
                    self.redelivered += 1;
                }
                *self.holding.entry(event.pid).or_default() += 1;
            }
            (Role::Consumer, Some("settled")) => {
                let verdict = words.nth(1).unwrap_or("?").to_owned();
                if words.next() == Some("unsettled") {
                    self.unsettled += 1;
                } else {
                    *self.verdicts.entry(verdict).or_default() += 1;
                }
                *self.holding.entry(event.pid).or_default() -= 1;
            }
            (Role::Consumer, Some("published")) => self.published_directly += 1,
            (Role::Relay, Some("round")) => {
                match words.next() {
                    Some("unavailable") => self.rounds_unavailable += 1,
                    Some("refused") => self.rounds_refused += 1,
                    _ => self.rounds_failed += 1,
                }
                if self.round_reasons.len() < 5 {
                    self.round_reasons.push(event.line.clone());
                }
            }
            (Role::Receiver, Some("recorded")) => {
                self.recorded += 1;
                if event.line.ends_with(" duplicate") {
                    self.recorded_duplicates += 1;
                }
            }
            (Role::Receiver, Some("trouble")) => self.receiver_trouble += 1,
            _ => {}
        }
    }

    pub fn verdict(&self, kind: &str) -> u64 {
        self.verdicts.get(kind).copied().unwrap_or(0)
    }
}

struct Process {
    child: Child,
    stdin: ChildStdin,
    pid: u32,
    name: String,
}

/// How the processes are started.
pub struct Setup {
    pub database: LedgerDb,
    pub amqp_url: String,
    pub nats_url: String,
    pub run: String,
    pub stream: String,
    /// `--mutation <flag>` for A's consumers.
    pub mutation: Option<&'static str>,
}

/// The processes, their events and what they said.
pub struct Fleet {
    setup: Setup,
    processes: HashMap<(Role, usize), Process>,
    spawned: usize,
    sender: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    /// Every event, in order.
    pub log: Vec<Event>,
    pub tally: Tally,
    /// Processes the test killed.
    ended: HashSet<u32>,
    /// `INBOX_CHAOS_TRACE=1`: every event printed, timed from `born`.
    trace: bool,
    born: Instant,
}

impl Fleet {
    pub fn new(setup: Setup) -> Fleet {
        let (sender, events) = mpsc::unbounded_channel();
        Fleet {
            setup,
            processes: HashMap::new(),
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

    fn process(&self, role: Role, slot: usize) -> &Process {
        self.processes
            .get(&(role, slot))
            .unwrap_or_else(|| panic!("no {role:?} in slot {slot}"))
    }

    pub fn pid(&self, role: Role, slot: usize) -> u32 {
        self.process(role, slot).pid
    }

    /// The process's name: its sessions' `application_name`.
    pub fn name(&self, role: Role, slot: usize) -> String {
        self.process(role, slot).name.clone()
    }

    /// The prefix of the names of `role`'s processes.
    pub fn names_of(&self, role: Role) -> String {
        format!("{}_{}", self.setup.run, role.mode())
    }

    /// Starts a process in `slot` of `role` and waits until it says
    /// `ready`.
    pub async fn spawn(&mut self, role: Role, slot: usize, deadline: Instant) {
        let name = format!("{}{slot}_{}", self.names_of(role), self.spawned);
        self.spawned += 1;
        let setup = &self.setup;
        let url = setup.database.tagged_url(&name);
        let mut args: Vec<&str> = vec![role.mode(), &url];
        match role {
            Role::Consumer => {
                args.extend([
                    setup.amqp_url.as_str(),
                    &setup.run,
                    &setup.nats_url,
                    &setup.run,
                ]);
                if let Some(mutation) = setup.mutation {
                    args.extend(["--mutation", mutation]);
                }
            }
            Role::Relay => args.extend([setup.nats_url.as_str(), &setup.run]),
            Role::Receiver => args.extend([setup.nats_url.as_str(), &setup.stream]),
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-hop"))
            .args(&args)
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
                let _ = sender.send(Event {
                    pid,
                    role,
                    line,
                    exited: false,
                });
            }
            let _ = sender.send(Event {
                pid,
                role,
                line: String::new(),
                exited: true,
            });
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
        let what = format!("{} {slot} ready", role.mode());
        self.wait_for(deadline, &what, |event| {
            event.pid == pid && (event.line == "ready" || event.exited)
        })
        .await;
    }

    /// Sends `command` to the process in `slot` of `role`.
    pub async fn command(&mut self, role: Role, slot: usize, command: &str) {
        let process = self
            .processes
            .get_mut(&(role, slot))
            .expect("a running process");
        process
            .stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write to a process");
        process.stdin.flush().await.expect("flush");
    }

    /// SIGKILLs the process in `slot` of `role` and waits for its end.
    pub async fn kill(&mut self, role: Role, slot: usize) {
        let mut process = self
            .processes
            .remove(&(role, slot))
            .expect("a running process");
        self.ended.insert(process.pid);
        process.child.start_kill().expect("SIGKILL");
        process
            .child
            .wait()
            .await
            .expect("wait for a killed process");
        self.tally.holding.remove(&process.pid);
    }

    /// SIGKILLs every process.
    pub async fn kill_all(&mut self) {
        let keys: Vec<(Role, usize)> = self.processes.keys().copied().collect();
        for (role, slot) in keys {
            self.kill(role, slot).await;
        }
    }

    /// Starts again the processes that exited by themselves (recorded as
    /// unexpected).
    pub async fn restart_exited(&mut self, deadline: Instant) {
        self.pump(Duration::ZERO).await;
        let keys: Vec<(Role, usize)> = self.processes.keys().copied().collect();
        for (role, slot) in keys {
            let process = self.processes.get_mut(&(role, slot)).expect("a process");
            if process.child.try_wait().expect("try_wait").is_some() {
                let mut process = self.processes.remove(&(role, slot)).expect("a process");
                let status = process.child.wait().await.expect("wait");
                self.tally
                    .unexpected_exits
                    .push(format!("{} ({status})", process.name));
                self.tally.holding.remove(&process.pid);
                self.spawn(role, slot, deadline).await;
            }
        }
    }

    /// Whether no consumer holds a delivery.
    pub fn idle(&self) -> bool {
        self.processes
            .values()
            .all(|process| self.tally.holding.get(&process.pid).copied().unwrap_or(0) == 0)
    }

    fn record(&mut self, event: Event) -> Event {
        if self.trace {
            let _ = writeln!(
                std::io::stderr().lock(),
                "hop {:>7.3} {:?} {} {}",
                self.born.elapsed().as_secs_f64(),
                event.role,
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
            let _ = writeln!(
                std::io::stderr().lock(),
                "outbox hop: {:?} process {} exited by itself",
                event.role,
                event.pid
            );
        }
        self.log.push(event.clone());
        event
    }

    /// Takes events for `period`.
    pub async fn pump(&mut self, period: Duration) {
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
    pub async fn pump_until(
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
    pub async fn wait_for(
        &mut self,
        deadline: Instant,
        what: &str,
        wanted: impl FnMut(&Event) -> bool,
    ) -> Event {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.pump_until(left, wanted).await {
            Some(event) if !event.exited => event,
            _ => panic!(
                "outbox hop: no {what} before the deadline (or the process exited); last events: {:?}",
                &self.log[self.log.len().saturating_sub(20)..]
            ),
        }
    }

    /// Whether payment `id`, whose delivery process `killed` held after the
    /// commit, was delivered again to another process and absorbed there
    /// as a duplicate.
    pub fn absorbed_elsewhere(&self, id: &str, killed: u32) -> bool {
        let redelivered = format!("delivered {id} 1");
        let absorbed = format!("settled {id} duplicate");
        let elsewhere = || {
            self.log
                .iter()
                .filter(|event| event.pid != killed && event.role == Role::Consumer)
        };
        elsewhere().any(|event| event.line == redelivered)
            && elsewhere().any(|event| event.line == absorbed)
    }
}
