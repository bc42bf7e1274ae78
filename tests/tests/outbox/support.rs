//! What the outbox tests share: publishers that stand in for a broker's
//! answers (the broker's behaviour is not what these tests check: the
//! chaos suite runs the real ones), and reads of the outbox table.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::connection::LoadConnection;
use inbox_runtime::outbox::{
    self, BlockingPublisher, OutboxId, OutboxMessage, OutgoingMessage, PublishError, Publisher,
};
use inbox_runtime::{InboxBackend, InboxError};
use inbox_tests::SqlRows;

/// A broker that confirms everything except what `refuse_destination`,
/// `unavailable`, `unavailable_destination` or `flaky_every` pick, and
/// keeps what it confirmed, in order.
#[derive(Clone, Default)]
pub struct Broker {
    pub confirmed: Arc<Mutex<Vec<OutboxMessage>>>,
    pub refuse_destination: Option<&'static str>,
    /// Every message unavailable.
    pub unavailable: bool,
    /// The messages to this destination unavailable.
    pub unavailable_destination: Option<&'static str>,
    /// Every n-th message this broker (and its clones) answers unavailable
    /// (0: none).
    pub flaky_every: usize,
    pub answered: Arc<std::sync::atomic::AtomicUsize>,
}

impl Broker {
    pub fn answer(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        messages
            .iter()
            .map(|message| {
                let answered = self
                    .answered
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let flaky = self.flaky_every > 0 && answered % self.flaky_every == 0;
                if self.unavailable
                    || flaky
                    || self.unavailable_destination == Some(message.destination.as_str())
                {
                    Err(PublishError::unavailable("connection refused"))
                } else if self.refuse_destination == Some(message.destination.as_str()) {
                    Err(PublishError::refused(format!(
                        "NO_ROUTE {}",
                        message.destination
                    )))
                } else {
                    self.confirmed.lock().unwrap().push(message.clone());
                    Ok(())
                }
            })
            .collect()
    }

    pub fn payloads(&self) -> Vec<String> {
        let confirmed = self.confirmed.lock().unwrap();
        confirmed
            .iter()
            .map(|message| String::from_utf8(message.payload.clone()).unwrap())
            .collect()
    }
}

impl BlockingPublisher for Broker {
    fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        self.answer(messages)
    }
}

impl Publisher for Broker {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        self.answer(messages)
    }
}

/// Records `messages` in one transaction: their ids.
pub fn send_all<C>(conn: &mut C, messages: &[OutgoingMessage]) -> Vec<OutboxId>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    conn.transaction(|conn| {
        messages
            .iter()
            .map(|message| outbox::send(conn, message))
            .collect::<Result<Vec<_>, InboxError>>()
    })
    .expect("record the messages")
}

/// A keyed message whose payload is its text.
pub fn keyed(key: &str, text: &str) -> OutgoingMessage {
    OutgoingMessage::new("receipts", text).ordering_key(key)
}

/// Whether the backend's relay rounds hold their rows locked in a
/// transaction (PostgreSQL) rather than lease them for a time (a lease
/// written and committed before publishing).
pub fn rounds_hold_locks<B: inbox_tests::TestBackend>() -> bool {
    inbox_runtime::outbox::lease_statement::<inbox_tests::DieselBackend<B>>(false).is_some()
}

/// Rows of the outbox table.
pub fn rows(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM inbox_outbox")
}

/// Rows marked sent.
pub fn sent(conn: &mut impl SqlRows) -> i64 {
    conn.bigint("SELECT COUNT(*) AS value FROM inbox_outbox WHERE sent_at IS NOT NULL")
}

/// The key's messages' sequence numbers, by payload order of `payloads`.
pub fn key_seqs(conn: &mut impl SqlRows, key: &str) -> Vec<i64> {
    conn.bigints(&format!(
        "SELECT key_seq AS value FROM inbox_outbox WHERE ordering_key = '{key}' ORDER BY position"
    ))
}

/// Waits up to 10 s for `done`.
pub fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
/// The backlog `m0`..`m29` over keys `k0`..`k2` (`m{n}` on key `k{n % 3}`).
pub fn backlog() -> Vec<OutgoingMessage> {
    (0..30)
        .map(|n| keyed(&format!("k{}", n % 3), &format!("m{n}")))
        .collect()
}

/// Each key of the [`backlog`] published in commit order.
pub fn assert_keys_in_order(payloads: &[String]) {
    for key in 0..3 {
        let order: Vec<&String> = payloads
            .iter()
            .filter(|p| {
                p.strip_prefix('m')
                    .and_then(|n| n.parse::<usize>().ok())
                    .is_some_and(|n| n % 3 == key)
            })
            .collect();
        let expected: Vec<String> = (0..30)
            .filter(|n| n % 3 == key)
            .map(|n| format!("m{n}"))
            .collect();
        assert_eq!(
            order,
            expected.iter().collect::<Vec<_>>(),
            "key k{key} in order"
        );
    }
}

/// Unavailable until `healed`, and panics once on its first call after.
#[derive(Clone)]
pub struct Flaky {
    pub broker: Broker,
    pub healed: Arc<Mutex<bool>>,
    pub panicked: Arc<Mutex<bool>>,
}

impl Publisher for Flaky {
    async fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        BlockingPublisher::publish(self, messages)
    }
}

impl BlockingPublisher for Flaky {
    fn publish(&mut self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        if !*self.healed.lock().unwrap() {
            return messages
                .iter()
                .map(|_| Err(PublishError::unavailable("connection refused")))
                .collect();
        }
        let mut panicked = self.panicked.lock().unwrap();
        if !*panicked {
            *panicked = true;
            drop(panicked);
            panic!("deliberate: the publisher panics once");
        }
        self.broker.answer(messages)
    }
}

/// [`eventually`] on a tokio task.
#[cfg(feature = "async")]
pub async fn eventually_async(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The commit-notification triggers on this test's own outbox table (the
/// other tests' schemas share the database).
pub fn notify_triggers(conn: &mut impl SqlRows) -> i64 {
    conn.bigint(
        "SELECT count(*) AS value FROM pg_trigger \
         WHERE tgname = 'inbox_outbox_notify' AND tgrelid = 'inbox_outbox'::regclass",
    )
}

/// The server connection (PostgreSQL) of a relay listening for commits
/// under `application_name` `tag`, once it has run its `LISTEN`, other than
/// `not`: waits up to 10 s for it.
pub fn listener_pid(conn: &mut impl SqlRows, tag: &str, not: Option<i64>) -> i64 {
    let sql = format!(
        "SELECT pid::bigint AS value FROM pg_stat_activity \
         WHERE application_name = '{tag}' AND query = 'LISTEN inbox_outbox'"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = conn.bigints(&sql);
        if let [pid] = pids[..]
            && Some(pid) != not
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no listening connection: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The incoming trace the trace tests continue.
pub const INCOMING_TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The `traceparent` headers of each message `broker` confirmed, by payload.
pub fn traceparents(broker: &Broker) -> std::collections::BTreeMap<String, Vec<String>> {
    broker
        .confirmed
        .lock()
        .unwrap()
        .iter()
        .map(|message| {
            let values = message
                .headers
                .iter()
                .filter(|(name, _)| name == "traceparent")
                .map(|(_, value)| value.clone())
                .collect();
            (
                String::from_utf8_lossy(&message.payload).into_owned(),
                values,
            )
        })
        .collect()
}

/// Whether `traceparent` continues [`INCOMING_TRACE`]: its trace id and
/// flags, a span of its own.
pub fn continues_incoming(traceparent: &[String]) -> bool {
    matches!(traceparent, [one] if one.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-")
        && one.ends_with("-01")
        && !one.contains("00f067aa0ba902b7"))
}
