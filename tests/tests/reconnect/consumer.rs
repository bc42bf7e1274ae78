//! The consumer loop a user writes from the guide's "Errors: retry,
//! reconnect, or dead-letter": deliver each message until it succeeds,
//! redeliver on the same connection while the error says `Retry`, drop the
//! connection and connect again on `Reconnect`, both with a bounded backoff.
//! The broker acknowledges a message only after the handler returned `Ok`,
//! so a failure never skips a message.
//!
//! The decisions live in [`State`], written once; [`consume`] (blocking) and
//! [`consume_async`] only run them. A consumer that makes no progress for
//! [`GIVE_UP_AFTER`] gives up with an error, so a consumer that spins on a
//! dead connection fails its test instead of hanging it.

use std::collections::BTreeMap;
use std::fmt::{self, Debug};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use inbox_runtime::Outcome;

use crate::app::{Payment, Recovery};

/// How long a consumer may go without one successful delivery before it
/// gives up (a restart takes about a second here).
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(20);

/// The delay after failed attempts in a row: the runtime's one backoff
/// policy, with steps short enough for a test (10 ms, doubling, at most
/// 200 ms).
const BACKOFF: inbox_runtime::Backoff = inbox_runtime::Backoff {
    first: Duration::from_millis(10),
    max: Duration::from_millis(200),
};

/// The broker's poll interval, waited before each delivery: a steady stream
/// rather than a burst, so that a fault injected after some deliveries lands
/// while the consumer still has messages to deliver.
const BROKER_POLL: Duration = Duration::from_millis(1);

fn backoff(failures: u32) -> Duration {
    BACKOFF.after(failures)
}

/// What a consumer has done so far, shared with the test that injects faults.
#[derive(Default)]
pub struct Progress {
    processed: AtomicUsize,
    recoveries: Mutex<Vec<Instant>>,
    finished: AtomicBool,
}

impl Progress {
    /// Deliveries that returned `Ok` (processed or duplicate).
    pub fn processed(&self) -> usize {
        self.processed.load(Ordering::SeqCst)
    }

    /// Whether the consumer has returned (done, or given up).
    pub fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// The first successful delivery after `since` that followed a failure.
    pub fn recovered_after(&self, since: Instant) -> Option<Instant> {
        let recoveries = self.recoveries.lock().unwrap_or_else(|e| e.into_inner());
        recoveries.iter().copied().find(|&at| at > since)
    }

    /// Waits until the consumer has delivered `threshold` messages (for a
    /// fault injector); `Err` if it stopped before, or after [`FAULT_WAIT`].
    pub fn wait_for_processed(&self, threshold: usize) -> Result<(), String> {
        wait_until("the consumer's progress", || {
            self.processed() >= threshold || self.finished()
        })?;
        if self.finished() {
            return Err(format!(
                "the consumer stopped before {threshold} deliveries"
            ));
        }
        Ok(())
    }

    /// Waits for the consumer's first recovery after the fault injected at
    /// `since`, and returns its instant; `Err` if it stopped without one, or
    /// after [`FAULT_WAIT`].
    pub fn wait_for_recovery(&self, since: Instant) -> Result<Instant, String> {
        wait_until("the consumer to resume", || {
            self.recovered_after(since).is_some() || self.finished()
        })?;
        self.recovered_after(since)
            .ok_or_else(|| "the consumer stopped without resuming".to_owned())
    }
}

/// A bound on each wait of a fault injector: reached only on a hang.
pub const FAULT_WAIT: Duration = Duration::from_secs(60);

/// Polls `done` until it holds, at most [`FAULT_WAIT`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> Result<(), String> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > FAULT_WAIT {
            return Err(format!("waited {FAULT_WAIT:?} for {what}"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// What one consumer run saw.
#[derive(Default)]
pub struct Report {
    /// Deliveries that returned `Ok(Outcome::Processed)`.
    pub processed: usize,
    /// Deliveries that returned `Ok(Outcome::Duplicate)`.
    pub duplicates: usize,
    /// Failed deliveries answered with `Retry` (redelivered on the same connection).
    pub retries: usize,
    /// Failed deliveries answered with `Reconnect` (connection dropped).
    pub reconnects: usize,
    /// Attempts to get a new connection that failed.
    pub failed_connects: usize,
    /// Every distinct failure, with its classification and how often it came.
    pub errors: BTreeMap<(String, String), usize>,
    /// Every acknowledged delivery, in order.
    pub acks: Vec<Ack>,
}

/// A delivery the handler answered `Ok`, which the broker then forgets.
pub struct Ack {
    /// The message's id.
    pub id: String,
    /// `Outcome::Processed` (else `Outcome::Duplicate`).
    pub processed: bool,
    /// When the successful attempt began (the handler was called).
    pub started: Instant,
    /// When the handler returned.
    pub at: Instant,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} processed, {} duplicates, {} retries, {} reconnects, {} failed connects",
            self.processed, self.duplicates, self.retries, self.reconnects, self.failed_connects
        )?;
        for ((recovery, error), count) in &self.errors {
            write!(f, "\n    {count} x {recovery}: {error}")?;
        }
        Ok(())
    }
}

/// What the driver does next.
enum Step {
    /// The message is done (acknowledged): deliver the next one.
    Next,
    /// Deliver the same message again on the same connection, after the delay.
    Again(Duration),
    /// Drop the connection, wait, connect again, deliver the same message.
    Reconnect(Duration),
}

/// The consumer's decisions, shared by the blocking and the async driver.
struct State<'a> {
    progress: &'a Progress,
    report: Report,
    failures: u32,
    last_success: Instant,
}

impl<'a> State<'a> {
    fn new(progress: &'a Progress) -> Self {
        State {
            progress,
            report: Report::default(),
            failures: 0,
            last_success: Instant::now(),
        }
    }

    fn delivered(
        &mut self,
        message: &Payment,
        started: Instant,
        outcome: Result<Outcome<()>, (Recovery, String)>,
    ) -> Result<Step, String> {
        match outcome {
            Ok(outcome) => {
                self.report.acks.push(Ack {
                    id: message.id.clone(),
                    processed: matches!(outcome, Outcome::Processed(())),
                    started,
                    at: Instant::now(),
                });
                if self.failures > 0 {
                    let mut recoveries = self
                        .progress
                        .recoveries
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    recoveries.push(Instant::now());
                }
                self.failures = 0;
                self.last_success = Instant::now();
                match outcome {
                    Outcome::Processed(()) => self.report.processed += 1,
                    Outcome::Duplicate => self.report.duplicates += 1,
                }
                self.progress.processed.fetch_add(1, Ordering::SeqCst);
                Ok(Step::Next)
            }
            Err((recovery, error)) => {
                self.failed(format!("{recovery:?}"), &error)?;
                let delay = backoff(self.failures);
                match recovery {
                    // A copy of a delivery in flight (on the lost primary,
                    // say) waits like a retry, later.
                    Recovery::Retry | Recovery::RetryLater => {
                        self.report.retries += 1;
                        Ok(Step::Again(delay))
                    }
                    Recovery::Reconnect => {
                        self.report.reconnects += 1;
                        Ok(Step::Reconnect(delay))
                    }
                    _ => Err(format!(
                        "a delivery failed for good ({recovery:?}; a consumer would dead-letter it): {error}"
                    )),
                }
            }
        }
    }

    fn connect_failed(&mut self, error: &str) -> Result<Duration, String> {
        self.report.failed_connects += 1;
        self.failed("connect".to_owned(), error)?;
        Ok(backoff(self.failures))
    }

    fn failed(&mut self, what: String, error: &str) -> Result<(), String> {
        self.failures += 1;
        let mut short: String = error.replace(['\n', '\t'], " ");
        short.truncate(140);
        *self.report.errors.entry((what, short)).or_default() += 1;
        if self.last_success.elapsed() > GIVE_UP_AFTER {
            return Err(format!(
                "no delivery succeeded for {GIVE_UP_AFTER:?} ({} attempts failed in a row); \
                 last error: {error}\n{}",
                self.failures, self.report
            ));
        }
        Ok(())
    }

    fn finish(self, result: Result<(), String>) -> Result<Report, String> {
        self.progress.finished.store(true, Ordering::SeqCst);
        result.map(|()| self.report)
    }
}

/// Delivers `deliveries` in order through `deliver` on connections from
/// `connect`, as described in the [module docs](self).
pub fn consume<C, E: Debug>(
    deliveries: &[Payment],
    progress: &Progress,
    mut connect: impl FnMut() -> Result<C, String>,
    mut deliver: impl FnMut(&mut C, &Payment) -> Result<Outcome<()>, E>,
    classify: impl Fn(&E) -> Recovery,
) -> Result<Report, String> {
    let mut state = State::new(progress);
    let mut conn: Option<C> = None;
    let mut next = 0;
    let result = loop {
        let Some(message) = deliveries.get(next) else {
            break Ok(());
        };
        let c = match &mut conn {
            Some(c) => c,
            None => match connect() {
                Ok(c) => conn.insert(c),
                Err(error) => match state.connect_failed(&error) {
                    Ok(delay) => {
                        std::thread::sleep(delay);
                        continue;
                    }
                    Err(error) => break Err(error),
                },
            },
        };
        std::thread::sleep(BROKER_POLL);
        let started = Instant::now();
        let outcome = deliver(c, message).map_err(|e| (classify(&e), format!("{e:?}")));
        match state.delivered(message, started, outcome) {
            Ok(Step::Next) => next += 1,
            Ok(Step::Again(delay)) => std::thread::sleep(delay),
            Ok(Step::Reconnect(delay)) => {
                conn = None; // a pool's connection goes back, to be discarded
                std::thread::sleep(delay);
            }
            Err(error) => break Err(error),
        }
    };
    state.finish(result)
}

/// [`consume`] for async connections: the same decisions, awaited.
#[cfg(feature = "async")]
pub async fn consume_async<C, E: Debug>(
    deliveries: &[Payment],
    progress: &Progress,
    mut connect: impl AsyncFnMut() -> Result<C, String>,
    mut deliver: impl AsyncFnMut(&mut C, &Payment) -> Result<Outcome<()>, E>,
    classify: impl Fn(&E) -> Recovery,
) -> Result<Report, String> {
    let mut state = State::new(progress);
    let mut conn: Option<C> = None;
    let mut next = 0;
    let result = loop {
        let Some(message) = deliveries.get(next) else {
            break Ok(());
        };
        let c = match &mut conn {
            Some(c) => c,
            None => match connect().await {
                Ok(c) => conn.insert(c),
                Err(error) => match state.connect_failed(&error) {
                    Ok(delay) => {
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                    Err(error) => break Err(error),
                },
            },
        };
        tokio::time::sleep(BROKER_POLL).await;
        let started = Instant::now();
        let outcome = deliver(c, message)
            .await
            .map_err(|e| (classify(&e), format!("{e:?}")));
        match state.delivered(message, started, outcome) {
            Ok(Step::Next) => next += 1,
            Ok(Step::Again(delay)) => tokio::time::sleep(delay).await,
            Ok(Step::Reconnect(delay)) => {
                conn = None;
                tokio::time::sleep(delay).await;
            }
            Err(error) => break Err(error),
        }
    };
    state.finish(result)
}
