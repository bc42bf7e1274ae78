//! Consumers spread over the cluster's nodes, delivering the same ids at
//! once: the workload of `race` and `node_failure`.
//!
//! The ids are split into lanes; each lane has one consumer per node, and
//! the three walk the lane's ids in the same order, so the copies of an id
//! (three for even ids, two for odd ones) arrive at about the same time on
//! different nodes. A delivery that fails is handled as its `Recovery`
//! says: `Retry` puts it back (a broker's nack: redelivered about 10 ms
//! later, after the consumer's next messages), `Reconnect` also drops the
//! connection and moves the consumer to the next node's pool. `Never`
//! fails the test.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use diesel::MysqlConnection;
use diesel::r2d2::{ConnectionManager, PooledConnection};
use diesel::result::{DatabaseErrorKind, Error};
use inbox_runtime::{Outcome, Recovery, is_lock_conflict, recovery};
use inbox_tests::GaleraCluster;
use inbox_tests::galera::NODES;

use crate::support::{Delivery, MysqlPool, apply, conflicts, report};

/// How long a broker takes to redeliver a nacked message, here.
const REDELIVERY_DELAY: Duration = Duration::from_millis(10);
/// A message redelivered this often is stuck: fail instead of spinning.
const MAX_REDELIVERIES: u32 = 50;
/// A consumer that finds no node for this long fails the test.
const NO_NODE_LIMIT: Duration = Duration::from_secs(60);

/// What a consumer does with an error that `is_lock_conflict` recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Hand it back to the broker: the message is redelivered later.
    Redeliver,
    /// Deliver again at once, up to `attempts` tries in all, as the runtime
    /// would if it retried a refused COMMIT itself; then hand it back.
    RetryAtOnce { attempts: u32 },
}

pub struct Workload<'a> {
    pub prefix: &'a str,
    pub ids: usize,
    pub lanes: usize,
    pub mode: Mode,
}

/// Shared with a fault injector running beside the consumers.
pub struct Progress {
    /// Deliveries answered `Ok` so far (processed or duplicate).
    pub answered: AtomicUsize,
    /// Every consumer is done.
    pub finished: AtomicBool,
    /// Milliseconds each consumer waits before each delivery (0: none), set
    /// by a fault injector that needs the run to outlast what it waits for.
    pub pace_ms: AtomicU64,
}

type Conn = PooledConnection<ConnectionManager<MysqlConnection>>;

#[derive(Default)]
pub struct Figures {
    pub elapsed: Duration,
    pub consumers: usize,
    /// Handler calls, retries included.
    pub calls: u64,
    /// Errors a consumer handed back (or acted on), by what they were.
    pub seen: BTreeMap<&'static str, u64>,
    /// Lock conflicts retried at once inside the consumer (`RetryAtOnce`), by what they were.
    pub retried_at_once: BTreeMap<&'static str, u64>,
    /// Redeliveries after an error that were duplicates / processed the message.
    pub redelivered_duplicate: u64,
    pub redelivered_processed: u64,
    /// Ids whose body ran more than once, and the extra runs.
    pub ids_run_twice: u64,
    pub extra_bodies: u64,
    /// Server counters over the run, summed over the nodes.
    pub cert_failures: u64,
    pub bf_aborts: u64,
    /// Error texts, with how often each was seen.
    pub messages: BTreeMap<String, u64>,
    /// `(when, from, to)`: a consumer moved to another node.
    pub moves: Vec<(Instant, usize, usize)>,
    /// `(consumer, when, node)` of every answered delivery.
    pub answers: Vec<(usize, Instant, usize)>,
    /// `(id, consumer, when, node)` of every `Processed` answer.
    pub processed_by: Vec<(usize, usize, Instant, usize)>,
    /// Errors classified `Never` (the test fails on any).
    pub never: Vec<String>,
}

impl Figures {
    fn merge(&mut self, other: Figures) {
        self.calls += other.calls;
        for (k, v) in other.seen {
            *self.seen.entry(k).or_default() += v;
        }
        for (k, v) in other.retried_at_once {
            *self.retried_at_once.entry(k).or_default() += v;
        }
        for (k, v) in other.messages {
            *self.messages.entry(k).or_default() += v;
        }
        self.redelivered_duplicate += other.redelivered_duplicate;
        self.redelivered_processed += other.redelivered_processed;
        self.moves.extend(other.moves);
        self.answers.extend(other.answers);
        self.never.extend(other.never);
        self.processed_by.extend(other.processed_by);
    }

    /// Errors the consumers handled (handed back or reconnected for).
    pub fn seen_total(&self) -> u64 {
        self.seen.values().sum()
    }

    pub fn print(&self, label: &str, ids: usize) {
        let seconds = self.elapsed.as_secs_f64();
        report!(
            "{label}: {ids} ids over {NODES} nodes by {} consumers in {seconds:.2} s \
             ({:.0} ids/s, {} handler calls); bodies run twice: {} ids ({} extra runs); \
             errors the consumer saw: {} {:?}; retried at once inside the consumer: {:?}; \
             their redeliveries: {} duplicates, {} processed; server: {} certification \
             failures, {} brute-force aborts",
            self.consumers,
            ids as f64 / seconds,
            self.calls,
            self.ids_run_twice,
            self.extra_bodies,
            self.seen_total(),
            self.seen,
            self.retried_at_once,
            self.redelivered_duplicate,
            self.redelivered_processed,
            self.cert_failures,
            self.bf_aborts,
        );
        for (message, count) in &self.messages {
            report!("{label}:   {count} × {message}");
        }
    }
}

/// What an error is, for the figures.
fn kind_of(ran: bool, error: &Error) -> &'static str {
    let conflict = is_lock_conflict(error);
    match (ran, error) {
        (true, Error::DatabaseError(DatabaseErrorKind::Unknown, _)) if conflict => {
            "refused COMMIT (Unknown)"
        }
        (true, Error::DatabaseError(DatabaseErrorKind::SerializationFailure, _)) => {
            "conflict in the body (SerializationFailure)"
        }
        (false, _) if conflict => "conflict at the claim",
        (true, _) if conflict => "conflict after the body (other kind)",
        _ => match recovery(error) {
            Recovery::Reconnect => "reconnect",
            Recovery::Retry => "other retry",
            Recovery::RetryLater => "in progress (retry later)",
            _ => "never",
        },
    }
}

fn delivers(id: usize, slot: usize) -> bool {
    id % 2 == 0 || (id / 2) % NODES != slot
}

/// Runs the workload; `fault`, if any, runs on a thread beside the
/// consumers. `bodies[i]` and `processed[i]` count body runs and
/// `Processed` answers of id `i`.
pub fn run(
    cluster: &GaleraCluster,
    pools: &[MysqlPool],
    work: &Workload<'_>,
    bodies: &[AtomicU32],
    processed: &[AtomicU32],
    fault: Option<&(dyn Fn(&Progress) + Sync)>,
) -> Figures {
    let progress = Progress {
        answered: AtomicUsize::new(0),
        finished: AtomicBool::new(false),
        pace_ms: AtomicU64::new(0),
    };
    let consumers = work.lanes * NODES;
    let (cert_before, bf_before) = conflicts(cluster);
    let started = Instant::now();
    let merged = Mutex::new(Figures::default());
    thread::scope(|scope| {
        let injector = fault.map(|fault| scope.spawn(|| fault(&progress)));
        let workers: Vec<_> = (0..consumers)
            .map(|consumer| {
                let (progress, merged) = (&progress, &merged);
                scope.spawn(move || {
                    let figures = consume(consumer, pools, work, bodies, processed, progress);
                    merged.lock().expect("figures").merge(figures);
                })
            })
            .collect();
        for worker in workers {
            worker.join().expect("a consumer panicked");
        }
        progress.finished.store(true, Ordering::SeqCst);
        if let Some(injector) = injector {
            injector.join().expect("the fault injector panicked");
        }
    });
    let mut figures = merged.into_inner().expect("figures");
    figures.elapsed = started.elapsed();
    figures.consumers = consumers;
    let (cert_after, bf_after) = conflicts(cluster);
    figures.cert_failures = cert_after.saturating_sub(cert_before);
    figures.bf_aborts = bf_after.saturating_sub(bf_before);
    for runs in &bodies[..work.ids] {
        let runs = u64::from(runs.load(Ordering::SeqCst));
        if runs > 1 {
            figures.ids_run_twice += 1;
            figures.extra_bodies += runs - 1;
        }
    }
    figures
}

fn consume(
    consumer: usize,
    pools: &[MysqlPool],
    work: &Workload<'_>,
    bodies: &[AtomicU32],
    processed: &[AtomicU32],
    progress: &Progress,
) -> Figures {
    let (lane, slot) = (consumer / NODES, consumer % NODES);
    let mut state = Consumer {
        consumer,
        node: slot,
        conn: None,
        pools,
        work,
        bodies,
        processed,
        progress,
        figures: Figures::default(),
        redeliveries: vec![0; work.ids],
    };
    let mut pending: VecDeque<(usize, Instant)> = VecDeque::new();
    for id in (lane..work.ids)
        .step_by(work.lanes)
        .filter(|&i| delivers(i, slot))
    {
        while pending
            .front()
            .is_some_and(|&(_, due)| due <= Instant::now())
        {
            let (again, _) = pending.pop_front().expect("a pending redelivery");
            if !state.deliver(again, true) {
                pending.push_back((again, Instant::now() + REDELIVERY_DELAY));
            }
        }
        if !state.deliver(id, false) {
            pending.push_back((id, Instant::now() + REDELIVERY_DELAY));
        }
    }
    while let Some((again, due)) = pending.pop_front() {
        thread::sleep(due.saturating_duration_since(Instant::now()));
        if !state.deliver(again, true) {
            pending.push_back((again, Instant::now() + REDELIVERY_DELAY));
        }
    }
    state.figures
}

struct Consumer<'a> {
    consumer: usize,
    node: usize,
    conn: Option<Conn>,
    pools: &'a [MysqlPool],
    work: &'a Workload<'a>,
    bodies: &'a [AtomicU32],
    processed: &'a [AtomicU32],
    progress: &'a Progress,
    figures: Figures,
    redeliveries: Vec<u32>,
}

impl Consumer<'_> {
    /// A connection from the current node's pool, moving on to the next
    /// node while a pool cannot give one.
    fn connection(&mut self) -> &mut Conn {
        let deadline = Instant::now() + NO_NODE_LIMIT;
        while self.conn.is_none() {
            match self.pools[self.node].get() {
                Ok(conn) => self.conn = Some(conn),
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "consumer {}: no node answered for {NO_NODE_LIMIT:?}: {error}",
                        self.consumer
                    );
                    self.move_on();
                }
            }
        }
        self.conn.as_mut().expect("a connection")
    }

    fn move_on(&mut self) {
        let from = self.node;
        self.node = (self.node + 1) % NODES;
        self.conn = None;
        self.figures.moves.push((Instant::now(), from, self.node));
    }

    /// One delivery of id `index`; `false` when it must come back later.
    fn deliver(&mut self, index: usize, redelivery: bool) -> bool {
        let pace = self.progress.pace_ms.load(Ordering::SeqCst);
        if pace > 0 {
            thread::sleep(Duration::from_millis(pace));
        }
        if redelivery {
            self.redeliveries[index] += 1;
            assert!(
                self.redeliveries[index] <= MAX_REDELIVERIES,
                "{}-{index} failed {MAX_REDELIVERIES} redeliveries",
                self.work.prefix
            );
        }
        let node = self.node;
        let delivery = Delivery::new(
            format!("{}-{index}", self.work.prefix),
            node,
            &self.bodies[index],
        );
        let mut tries = 1;
        let result = loop {
            self.figures.calls += 1;
            delivery.ran.set(false);
            let result = apply(self.connection(), &delivery);
            match (&result, self.work.mode) {
                (Err(error), Mode::RetryAtOnce { attempts })
                    if tries < attempts && is_lock_conflict(error) =>
                {
                    tries += 1;
                    let kind = kind_of(delivery.ran.get(), error);
                    *self.figures.retried_at_once.entry(kind).or_default() += 1;
                }
                _ => break result,
            }
        };
        match result {
            Ok(outcome) => {
                if outcome == Outcome::Processed(()) {
                    self.processed[index].fetch_add(1, Ordering::SeqCst);
                    self.figures
                        .processed_by
                        .push((index, self.consumer, Instant::now(), node));
                    self.figures.redelivered_processed += u64::from(redelivery);
                } else {
                    self.figures.redelivered_duplicate += u64::from(redelivery);
                }
                self.progress.answered.fetch_add(1, Ordering::SeqCst);
                self.figures
                    .answers
                    .push((self.consumer, Instant::now(), node));
                true
            }
            Err(error) => {
                let kind = kind_of(delivery.ran.get(), &error);
                *self.figures.seen.entry(kind).or_default() += 1;
                *self.figures.messages.entry(error.to_string()).or_default() += 1;
                match recovery(&error) {
                    // A copy whose first delivery (on a killed node, say) still
                    // holds its claim: redelivered, as the broker would later.
                    Recovery::Retry | Recovery::RetryLater => false,
                    Recovery::Reconnect => {
                        self.move_on();
                        false
                    }
                    // Dead-lettered: the test fails on it.
                    _ => {
                        self.figures.never.push(format!("{error:?}"));
                        true
                    }
                }
            }
        }
    }
}
