//! Fingerprints of text, bytes and serde values, and stored results, on a
//! real (in-memory SQLite) inbox.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::{Connection, SqliteConnection};
use inbox_runtime::{InboxError, Outcome, StoredOutcome, idempotent};

#[derive(serde::Serialize)]
pub struct Transfer {
    pub id: String,
    pub amount: i64,
    #[serde(skip)]
    pub raw: Vec<u8>,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub number: u64,
}

#[idempotent(id = msg.id, handler = "pass.bytes", fingerprint = msg.raw)]
pub fn by_bytes(conn: &mut SqliteConnection, msg: &Transfer) -> diesel::QueryResult<Outcome<()>> {
    let _ = conn;
    Ok(Outcome::Processed(()))
}

#[idempotent(id = msg.id, handler = "pass.text", fingerprint = format!("{}", msg.amount))]
pub fn by_text(conn: &mut SqliteConnection, msg: &Transfer) -> diesel::QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(id = msg.id, handler = "pass.stored", fingerprint = msg, store_result)]
pub fn stored(
    conn: &mut SqliteConnection,
    msg: &Transfer,
) -> Result<StoredOutcome<Receipt>, InboxError> {
    let _ = conn;
    Ok(StoredOutcome::Processed(Receipt {
        number: msg.amount as u64,
    }))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Transfer {
        id: "t-1".into(),
        amount: 5,
        raw: b"five".to_vec(),
    };
    assert_eq!(by_bytes(&mut conn, &msg).unwrap(), Outcome::Processed(()));
    assert_eq!(by_bytes(&mut conn, &msg).unwrap(), Outcome::Duplicate);
    by_text(&mut conn, &msg).unwrap();
    assert_eq!(
        stored(&mut conn, &msg).unwrap(),
        StoredOutcome::Processed(Receipt { number: 5 })
    );
    assert_eq!(
        stored(&mut conn, &msg).unwrap(),
        StoredOutcome::Replayed(Receipt { number: 5 })
    );
    let other = Transfer { amount: 6, ..msg };
    assert!(matches!(
        stored(&mut conn, &other),
        Err(InboxError::Conflict(_))
    ));
}
