//! What the outbox tests share: publishers that stand in for a broker's
//! answers (the broker's behaviour is not what these tests check: the
//! chaos suite runs the real ones), and reads of the outbox table.

use std::sync::{Arc, Mutex};

use diesel::connection::LoadConnection;
use inbox_runtime::outbox::{
    self, BlockingPublisher, OutboxId, OutboxMessage, OutgoingMessage, PublishError, Publisher,
};
use inbox_runtime::{InboxBackend, InboxError};
use inbox_tests::SqlRows;

/// A broker that confirms everything except what `refuse` or `unavailable`
/// pick, and keeps what it confirmed, in order.
#[derive(Clone, Default)]
pub struct Broker {
    pub confirmed: Arc<Mutex<Vec<OutboxMessage>>>,
    pub refuse_destination: Option<&'static str>,
    pub unavailable: bool,
}

impl Broker {
    pub fn answer(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        messages
            .iter()
            .map(|message| {
                if self.unavailable {
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
