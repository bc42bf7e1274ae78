use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use inbox_runtime::{AckDecision, InboxError, StoredOutcome, ack_decision, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
pub struct ChargeRequest {
    pub request_id: String,
    pub account: String,
    pub cents: i64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub charge: i64,
    pub cents: i64,
}

#[idempotent(id = req.request_id, handler = "billing.charge", fingerprint = req, store_result)]
pub fn charge(
    conn: &mut SqliteConnection,
    req: &ChargeRequest,
) -> Result<StoredOutcome<Receipt>, InboxError> {
    diesel::sql_query("INSERT INTO charges (account, cents) VALUES (?, ?)")
        .bind::<Text, _>(&req.account)
        .bind::<BigInt, _>(req.cents)
        .execute(conn)?;
    let charge =
        diesel::select(diesel::dsl::sql::<BigInt>("last_insert_rowid()")).get_result(conn)?;
    Ok(StoredOutcome::Processed(Receipt {
        charge,
        cents: req.cents,
    }))
}

#[test]
fn a_retry_gets_the_first_receipt() -> Result<(), Box<dyn std::error::Error>> {
    let mut conn = SqliteConnection::establish(":memory:")?;
    inbox_runtime::setup(&mut conn)?;
    diesel::sql_query("CREATE TABLE charges (account TEXT NOT NULL, cents BIGINT NOT NULL)")
        .execute(&mut conn)?;
    let req = ChargeRequest {
        request_id: "req-7".into(),
        account: "acct-1".into(),
        cents: 250,
    };
    let first = charge(&mut conn, &req)?;
    let retry = charge(&mut conn, &req)?; // the body does not run again
    assert!(first.is_processed() && retry.is_replayed());
    assert_eq!(first.value(), retry.value());

    // The same id with another payload: refused, nothing runs, dead-letter it.
    let tampered = ChargeRequest {
        cents: 99_999,
        ..req
    };
    let conflict = charge(&mut conn, &tampered);
    assert!(matches!(conflict, Err(InboxError::Conflict(_))));
    assert_eq!(ack_decision(&conflict), AckDecision::DeadLetter);
    Ok(())
}
