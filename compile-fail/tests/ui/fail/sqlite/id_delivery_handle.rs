use diesel::SqliteConnection;
use inbox_runtime::idempotent;

/// An SQS message as the AWS SDK returns it.
pub struct SqsMessage {
    pub message_id: Option<String>,
    pub receipt_handle: Option<String>,
}

impl SqsMessage {
    pub fn receipt_handle(&self) -> Option<&str> {
        self.receipt_handle.as_deref()
    }
}

/// An Azure Service Bus message received in peek-lock mode.
pub struct Locked {
    pub message_id: String,
    pub lock_token: String,
}

// A new receipt handle comes with every receive of the message.
#[idempotent(id = msg.receipt_handle(), handler = "sqs.handle")]
pub fn by_receipt(conn: &mut SqliteConnection, msg: &SqsMessage) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

// A new lock token comes with every delivery of the message.
#[idempotent(id = msg.lock_token, handler = "servicebus.lock")]
pub fn by_lock(conn: &mut SqliteConnection, msg: &Locked) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
