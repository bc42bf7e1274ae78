//! The relay in the background: rounds one after the other while there is
//! work, a wait when there is none, a backoff after failures. The loop is
//! written once ([`relay_loop`]); a thread over an r2d2 pool (feature
//! `r2d2`, [`thread`]) and a tokio task over a diesel-async pool (feature
//! `tokio`, [`task`]) are its front ends, which check a connection out for
//! each round and wait on the shared [`Signals`].

use std::fmt;
use std::future::Future;
use std::time::Duration;

use super::relay::{Relay, RelayReport};
use crate::backoff::Backoff;
use crate::error::InboxError;
use crate::execution::{Signals, caught};
use crate::text::{error_chain_text, panic_text};

/// A relay run in the background: a thread over an r2d2 pool
/// ([`spawn`](Self::spawn), feature `r2d2`) or a tokio task over a
/// diesel-async pool ([`spawn_task`](Self::spawn_task), feature `tokio`),
/// controlled through the same handles as the pruner's
/// ([`WorkerThread`](crate::background::WorkerThread),
/// [`WorkerTask`](crate::background::WorkerTask)).
///
/// The loop: a round ([`Relay::run_once`]); another at once if it found
/// messages (the next message of a key it published is ready now); after
/// an idle round, a wait of [`idle_wait`](Self::idle_wait) (or until the
/// handle's `run_now`, after a commit you know of); after a failed round
/// (the database, a connection checkout, a panicking publisher) or one in
/// which the broker was unavailable, a wait by [`backoff`](Self::backoff),
/// growing with the failures in a row, which neither `run_now` nor a
/// commit cuts short (a relay retrying a broker that is down as fast as
/// commits come would hammer it). Every round is reported to the
/// callback.
///
/// ```
/// # #[cfg(all(feature = "sqlite", feature = "r2d2"))] {
/// use std::time::Duration;
/// use inbox_runtime::outbox::{BackgroundRelay, Relay};
///
/// let relay = BackgroundRelay::new(Relay::new()).idle_wait(Duration::from_millis(200));
/// # let _ = relay;
/// # }
/// ```
#[derive(Debug, Clone)]
// Without `r2d2` or `tokio` it has no front end to run it.
#[cfg_attr(not(any(feature = "r2d2", feature = "tokio")), allow(dead_code))]
pub struct BackgroundRelay {
    relay: Relay,
    idle_wait: Duration,
    backoff: Backoff,
    checkout_timeout: Duration,
    thread_name: String,
    max_rate: Option<std::num::NonZeroU32>,
    /// The database to listen on for commits (PostgreSQL).
    #[cfg(feature = "postgres")]
    wake_on_commit: Option<String>,
}

impl BackgroundRelay {
    /// Rounds of `relay`; idle waits of 500 ms; backoff 100 ms doubling up
    /// to 30 s ([`Backoff::DEFAULT`]); connection checkouts bounded by 5 s;
    /// the thread named `inbox-outbox-relay`.
    ///
    /// ```
    /// let relay = inbox_runtime::outbox::BackgroundRelay::new(inbox_runtime::outbox::Relay::new());
    /// # let _ = relay;
    /// ```
    pub fn new(relay: Relay) -> BackgroundRelay {
        BackgroundRelay {
            relay,
            idle_wait: Duration::from_millis(500),
            backoff: Backoff::DEFAULT,
            checkout_timeout: Duration::from_secs(5),
            thread_name: "inbox-outbox-relay".to_owned(),
            max_rate: None,
            #[cfg(feature = "postgres")]
            wake_on_commit: None,
        }
    }

    /// The most messages a second the relay takes (0, the default: no
    /// limit). After a round of `n` messages, the next starts no sooner
    /// than `n / per_second` after the round began. A backlog drains at
    /// full speed otherwise, and on a machine the database shares with the
    /// handlers, the drain's CPU makes the handlers' deliveries wait
    /// (BENCHMARKS.md, "Draining a backlog"): a limit trades drain time for
    /// their latency. Set it above the rate messages are written, or the
    /// backlog grows.
    ///
    /// ```
    /// use inbox_runtime::outbox::{BackgroundRelay, Relay};
    ///
    /// // Batches of 100, at most 50 rounds a second.
    /// let relay = BackgroundRelay::new(Relay::new()).max_rate(5_000);
    /// # let _ = relay;
    /// ```
    pub fn max_rate(mut self, per_second: u32) -> BackgroundRelay {
        self.max_rate = std::num::NonZeroU32::new(per_second);
        self
    }

    /// The wait after a round that found nothing: the longest a message
    /// committed meanwhile waits for its round (without the handle's
    /// `run_now`).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let relay = inbox_runtime::outbox::BackgroundRelay::new(inbox_runtime::outbox::Relay::new())
    ///     .idle_wait(Duration::from_millis(100));
    /// # let _ = relay;
    /// ```
    pub fn idle_wait(mut self, wait: Duration) -> BackgroundRelay {
        self.idle_wait = wait;
        self
    }

    /// The wait after failed rounds in a row (or rounds the broker could not
    /// take).
    ///
    /// ```
    /// let relay = inbox_runtime::outbox::BackgroundRelay::new(inbox_runtime::outbox::Relay::new())
    ///     .backoff(inbox_runtime::Backoff::DEFAULT);
    /// # let _ = relay;
    /// ```
    pub fn backoff(mut self, backoff: Backoff) -> BackgroundRelay {
        self.backoff = backoff;
        self
    }

    /// The longest a round waits for a connection from the pool.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let relay = inbox_runtime::outbox::BackgroundRelay::new(inbox_runtime::outbox::Relay::new())
    ///     .checkout_timeout(Duration::from_secs(1));
    /// # let _ = relay;
    /// ```
    pub fn checkout_timeout(mut self, timeout: Duration) -> BackgroundRelay {
        self.checkout_timeout = timeout;
        self
    }

    /// The thread's name.
    ///
    /// ```
    /// let relay = inbox_runtime::outbox::BackgroundRelay::new(inbox_runtime::outbox::Relay::new())
    ///     .thread_name("billing-relay");
    /// # let _ = relay;
    /// ```
    pub fn thread_name(mut self, name: impl Into<String>) -> BackgroundRelay {
        self.thread_name = name.into();
        self
    }

    /// On PostgreSQL: runs a round as soon as a transaction that recorded
    /// messages commits, instead of at the end of the idle wait. The relay
    /// opens a connection of its own to `database_url`, enables the commit
    /// notifications ([`enable_commit_notifications`](crate::outbox::enable_commit_notifications):
    /// a trigger, created if missing; read its price there) and `LISTEN`s
    /// on the channel `inbox_outbox`; while idle it checks that connection
    /// every 10 ms (a read of what the server sent, no round trip). The
    /// relays of every schema in the database share that channel: a
    /// notification names the schema whose outbox committed, and the relay
    /// wakes for the schema of the outbox `database_url` sees (its
    /// `search_path`), which must be its pool's; a URL that sees no outbox
    /// table wakes it for every schema's commits. Give it a direct URL, not one through a
    /// transaction-pooling PgBouncer (which does not carry `LISTEN`), and
    /// with a `connect_timeout`: the listener connects on the relay's thread
    /// (a task's: on tokio's blocking pool), and a stop waits for a
    /// connection attempt in progress. If it cannot connect or loses its
    /// connection, the relay falls back to the idle wait and tries again
    /// once a second. Keep the idle wait as the
    /// bound for commits the listener misses.
    ///
    /// ```
    /// # #[cfg(feature = "postgres")] {
    /// let relay = inbox_runtime::outbox::BackgroundRelay::new(inbox_runtime::outbox::Relay::new())
    ///     .wake_on_commit("postgres://localhost/app");
    /// # let _ = relay;
    /// # }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn wake_on_commit(mut self, database_url: impl Into<String>) -> BackgroundRelay {
        self.wake_on_commit = Some(database_url.into());
        self
    }

    /// A listener for the front end, if the relay wakes on commits.
    #[cfg(all(feature = "postgres", any(feature = "r2d2", feature = "tokio")))]
    fn listener(&self) -> Option<listen::CommitListener> {
        self.wake_on_commit.clone().map(listen::CommitListener::new)
    }

    /// The wait before the next round after `round`, which took `took`,
    /// with `failures` failed rounds in a row so far (updated).
    #[cfg_attr(not(any(feature = "r2d2", feature = "tokio")), allow(dead_code))]
    fn next_wait(&self, round: &RelayRound, took: Duration, failures: &mut u32) -> Duration {
        match round {
            RelayRound::Done(report) if report.unavailable > 0 => {
                *failures = failures.saturating_add(1);
                self.backoff.after(*failures)
            }
            RelayRound::Done(report) => {
                *failures = 0;
                if report.is_idle() {
                    self.idle_wait
                } else {
                    self.pace(report.leased, took)
                }
            }
            RelayRound::Failed(_) => {
                *failures = failures.saturating_add(1);
                self.backoff.after(*failures)
            }
        }
    }
}

impl BackgroundRelay {
    /// What is left of the time `messages` take at the rate limit, once a
    /// round took `took`.
    #[cfg_attr(not(any(feature = "r2d2", feature = "tokio")), allow(dead_code))]
    fn pace(&self, messages: usize, took: Duration) -> Duration {
        let Some(rate) = self.max_rate else {
            return Duration::ZERO;
        };
        let allowed = Duration::from_secs_f64(messages as f64 / f64::from(rate.get()));
        allowed.saturating_sub(took)
    }
}

/// One round of a [`BackgroundRelay`], as its callback sees it.
#[derive(Debug)]
#[non_exhaustive]
pub enum RelayRound {
    /// The round ran (see [`RelayReport`]).
    Done(RelayReport),
    /// The round failed: its leased messages, if any, go out when their
    /// lease runs out.
    Failed(RelayRoundError),
}

/// Why a background relay's round failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RelayRoundError {
    /// No connection from the pool within the checkout timeout.
    Checkout(String),
    /// The round's statements failed (see [`InboxError::recovery`]).
    Relay(InboxError),
    /// The publisher (or the round) panicked; the relay goes on.
    Panicked(String),
}

impl RelayRound {
    /// `true` when the round ran and the broker took every message it was
    /// given (refusals included: they are the messages' fault, not the
    /// relay's).
    ///
    /// ```
    /// use inbox_runtime::outbox::{RelayReport, RelayRound};
    /// assert!(RelayRound::Done(RelayReport::default()).is_ok());
    /// ```
    pub fn is_ok(&self) -> bool {
        matches!(self, RelayRound::Done(report) if report.unavailable == 0)
    }
}

impl fmt::Display for RelayRound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RelayRound::Done(report) => write!(f, "relay round: {report}"),
            RelayRound::Failed(error) => write!(f, "relay round failed: {error}"),
        }
    }
}

impl fmt::Display for RelayRoundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RelayRoundError::Checkout(reason) => write!(f, "no connection from the pool: {reason}"),
            // With its causes: "the inbox's database operation failed:
            // database is locked".
            RelayRoundError::Relay(error) => f.write_str(&error_chain_text(error)),
            RelayRoundError::Panicked(message) => write!(f, "panicked: {message}"),
        }
    }
}

impl std::error::Error for RelayRoundError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RelayRoundError::Relay(error) => Some(error),
            RelayRoundError::Checkout(_) | RelayRoundError::Panicked(_) => None,
        }
    }
}

/// How the loop runs a round and waits, blocking or async.
#[cfg_attr(not(any(feature = "r2d2", feature = "tokio")), allow(dead_code))]
trait RelayFront {
    /// One round, on a connection of the front end's.
    fn round(&mut self) -> impl Future<Output = Result<RelayReport, RelayRoundError>>;

    /// Waits `delay` (or until woken): `false` once a stop was requested.
    ///
    /// `wakeable`: whether a run-now request or a commit notification ends
    /// the wait early. The backoff after a failed round is not: a relay
    /// woken by every commit would otherwise retry a broker that is down
    /// as fast as the commits come.
    fn wait(&mut self, delay: Duration, wakeable: bool) -> impl Future<Output = bool>;
}

/// Rounds until a stop is requested: the one loop of every front end.
#[cfg_attr(not(any(feature = "r2d2", feature = "tokio")), allow(dead_code))]
async fn relay_loop<E, F>(
    settings: &BackgroundRelay,
    front: &mut E,
    signals: &Signals,
    mut on_round: F,
) where
    E: RelayFront,
    F: FnMut(&RelayRound),
{
    let mut failures = 0;
    while !signals.stop_requested() {
        let started = std::time::Instant::now();
        let round = match caught(front.round()).await {
            Ok(Ok(report)) => RelayRound::Done(report),
            Ok(Err(error)) => RelayRound::Failed(error),
            Err(panic) => RelayRound::Failed(RelayRoundError::Panicked(
                panic_text(panic.as_ref()).to_owned(),
            )),
        };
        #[cfg(feature = "log")]
        match &round {
            RelayRound::Done(report) if report.is_idle() => {}
            RelayRound::Done(_) if round.is_ok() => {
                log::debug!(target: "inbox_runtime::outbox", "{round}")
            }
            _ => log::warn!(target: "inbox_runtime::outbox", "{round}"),
        }
        let _ = caught(async { on_round(&round) }).await;
        let wait = settings.next_wait(&round, started.elapsed(), &mut failures);
        // Only an idle wait ends early: a backoff's or the rate limit's
        // does not.
        let wakeable = matches!(&round, RelayRound::Done(report) if report.is_idle());
        if !wait.is_zero() && !front.wait(wait, wakeable && failures == 0).await {
            break;
        }
    }
}

#[cfg(all(feature = "postgres", any(feature = "r2d2", feature = "tokio")))]
mod listen;
#[cfg(feature = "tokio")]
mod task;
#[cfg(feature = "r2d2")]
mod thread;
