//! One delivery, whatever the broker: the handler, then the broker
//! decision. The brokers' consumers ([`rabbitmq`](super::rabbitmq),
//! [`nats`](super::nats)) call [`handle`], then do what
//! [`Verdict::decision`] says, and only then take the next step.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use inbox_runtime::{ack_decision, AckDecision, Backoff, Outcome};

use super::ledger::{self, Payment, PaymentBody, Pool};

/// How long a consumer waits before it hands back a delivery to be
/// redelivered, after failures in a row: 100 ms, doubling up to 5 s.
pub const RETRY_BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

/// How long a consumer waits before it hands back a copy whose first
/// delivery is still in flight ([`Verdict::InProgress`]): longer than the
/// claim's bound ([`ClaimWait::DEFAULT`](inbox_runtime::ClaimWait::DEFAULT)),
/// so the first delivery has time to end before the copy comes back.
pub const IN_PROGRESS_DELAY: Duration = Duration::from_secs(5);

/// A delivery as the consumer received it.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    /// The producer-assigned id, if the message has one.
    pub message_id: Option<&'a str>,
    /// Whether the broker says it delivered this message before (AMQP
    /// `redelivered`; JetStream: delivered more than once).
    pub redelivered: bool,
}

/// What became of a delivery: the handler's result as the consumer tells
/// the broker. Each kind has one [`AckDecision`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The payment was applied now: ack.
    Applied,
    /// The payment had been applied by an earlier delivery: ack.
    Duplicate,
    /// The handler made the message dead now (a rejection, or its last
    /// allowed attempt failed): dead-letter.
    Dead(String),
    /// A redelivery of a message the inbox already holds as dead (the
    /// consumer that made it dead did not get to dead-letter it):
    /// dead-letter.
    DeadAgain,
    /// A message the handler cannot even look at (no id, a payload that is
    /// not a payment): dead-letter, without the inbox.
    Unprocessable(String),
    /// Nothing was committed (a database failure, a failed attempt):
    /// redeliver.
    Retry(String),
    /// Another delivery of the message is still in flight (the claim gave
    /// up waiting for it): nothing ran; redeliver after
    /// [`IN_PROGRESS_DELAY`].
    InProgress(String),
}

impl Verdict {
    /// What to tell the broker.
    ///
    /// ```
    /// use inbox_examples::brokers::delivery::Verdict;
    /// use inbox_runtime::AckDecision;
    /// assert_eq!(Verdict::Duplicate.decision(), AckDecision::Ack);
    /// assert_eq!(Verdict::DeadAgain.decision(), AckDecision::DeadLetter);
    /// ```
    pub fn decision(&self) -> AckDecision {
        match self {
            Verdict::Applied | Verdict::Duplicate => AckDecision::Ack,
            Verdict::Dead(_) | Verdict::DeadAgain | Verdict::Unprocessable(_) => {
                AckDecision::DeadLetter
            }
            Verdict::Retry(_) => AckDecision::Retry,
            Verdict::InProgress(_) => AckDecision::RetryLater,
        }
    }

    /// A one-word name (`applied`, `duplicate`, `dead`, `dead-again`,
    /// `unprocessable`, `retry`, `in-progress`).
    pub fn kind(&self) -> &'static str {
        match self {
            Verdict::Applied => "applied",
            Verdict::Duplicate => "duplicate",
            Verdict::Dead(_) => "dead",
            Verdict::DeadAgain => "dead-again",
            Verdict::Unprocessable(_) => "unprocessable",
            Verdict::Retry(_) => "retry",
            Verdict::InProgress(_) => "in-progress",
        }
    }

    /// Whether the delivery committed something in the database (its
    /// effects, or the message's dead state): acknowledging it is all that
    /// is left.
    pub fn committed(&self) -> bool {
        matches!(self, Verdict::Applied | Verdict::Dead(_))
    }

    /// Why, for the verdicts that carry a reason.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Verdict::Dead(why)
            | Verdict::Unprocessable(why)
            | Verdict::Retry(why)
            | Verdict::InProgress(why) => Some(why),
            _ => None,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            Some(why) => write!(f, "{}: {why}", self.kind()),
            None => f.write_str(self.kind()),
        }
    }
}

/// Where a consumer reports what it does, and may be stopped: the
/// examples count (`run::Stats`), the chaos tests' consumer process prints
/// and pauses. Every method does nothing by default.
pub trait Probe: Send + Sync {
    /// The consumer is subscribed: deliveries may come.
    fn ready(&self) {}

    /// A delivery arrived; the handler has not run yet.
    fn delivered(&self, _delivery: &Received<'_>) {}

    /// Inside the handler's transaction, after the balance update and
    /// before the ledger entry.
    fn in_transaction(&self, _message_id: &str) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// The handler returned and the verdict is decided; the broker has not
    /// been told yet.
    fn before_settle(
        &self,
        _message_id: Option<&str>,
        _verdict: &Verdict,
    ) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }

    /// The broker was told (`Err`: telling it failed, and the delivery will
    /// come again).
    fn settled(&self, _message_id: Option<&str>, _verdict: &Verdict, _told: Result<(), &str>) {}
}

/// The probe that does nothing.
impl Probe for () {}

/// Runs the handler on one delivery and decides what to tell the broker.
///
/// `message_id` is the producer's id as the broker's metadata carries it;
/// `None` (a producer that forgot it) is dead-lettered without the inbox,
/// as is a payload that is not a payment. The decision on the handler's
/// result is [`ack_decision`]'s; a duplicate is also looked up in the
/// inbox's dead messages ([`ledger::is_dead`]), so that the redelivery of a
/// message that died is dead-lettered rather than acknowledged.
pub async fn handle<P: Probe>(
    pool: &Pool,
    message_id: Option<String>,
    payload: &[u8],
    probe: &P,
) -> Verdict {
    let Some(id) = message_id else {
        return Verdict::Unprocessable("the message has no id".into());
    };
    let body = match PaymentBody::decode(payload) {
        Ok(body) => body,
        Err(error) => return Verdict::Unprocessable(format!("not a payment: {error}")),
    };
    let payment = Payment { id, body };
    let mut conn = match pool.get().await {
        Ok(conn) => conn,
        Err(error) => return Verdict::Retry(format!("no database connection: {error}")),
    };
    let result = ledger::apply_payment(&mut conn, &payment, probe).await;
    match (ack_decision(&result), result) {
        (AckDecision::Ack, Ok(Outcome::Processed(()))) => Verdict::Applied,
        (AckDecision::Ack, _) => match ledger::is_dead(&mut conn, &payment.id).await {
            Ok(false) => Verdict::Duplicate,
            Ok(true) => Verdict::DeadAgain,
            Err(error) => Verdict::Retry(format!("is the duplicate dead? {error}")),
        },
        (AckDecision::Retry, result) => Verdict::Retry(error_text(result)),
        (AckDecision::RetryLater, result) => Verdict::InProgress(error_text(result)),
        (AckDecision::DeadLetter, result) => Verdict::Dead(error_text(result)),
    }
}

fn error_text<T>(result: Result<T, ledger::LedgerError>) -> String {
    result
        .err()
        .map(|error| error.to_string())
        .unwrap_or_default()
}
