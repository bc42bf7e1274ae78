use diesel::SqliteConnection;
use inbox_runtime::idempotent;

/// What async-nats' `jetstream::Message::info()` returns.
pub struct Info {
    pub stream_sequence: u64,
    pub consumer_sequence: u64,
    pub delivered: i64,
}

pub struct Message {
    pub info: Info,
}

impl Message {
    pub fn info(&self) -> Result<&Info, diesel::result::Error> {
        Ok(&self.info)
    }
}

// The consumer sequence grows with every delivery, redeliveries included.
#[idempotent(id = msg.info()?.consumer_sequence, handler = "nats.sequence")]
pub fn by_sequence(conn: &mut SqliteConnection, msg: &Message) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

// `delivered` counts the deliveries of the message.
#[idempotent(id = msg.info().unwrap().delivered, handler = "nats.delivered")]
pub fn by_count(conn: &mut SqliteConnection, msg: &Message) -> diesel::QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
