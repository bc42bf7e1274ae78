// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{InboxError, idempotent};

pub struct Payment {
    pub id: String,
    pub cents: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
    #[error(transparent)]
    Inbox(#[from] InboxError),
}

#[idempotent(id = msg.id)]
fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> Result<(), AppError> {
    diesel::sql_query("UPDATE account SET cents = cents + ?")
        .bind::<diesel::sql_types::BigInt, _>(msg.cents)
        .execute(conn)?;
    Ok(())
}

#[derive(QueryableByName)]
struct Balance {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    cents: i64,
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    diesel::sql_query("CREATE TABLE account (cents BIGINT NOT NULL)")
        .execute(&mut conn)
        .unwrap();
    diesel::sql_query("INSERT INTO account VALUES (0)")
        .execute(&mut conn)
        .unwrap();

    let msg = Payment {
        id: "pay-1".into(),
        cents: 250,
    };
    apply_payment(&mut conn, &msg).unwrap();
    apply_payment(&mut conn, &msg).unwrap(); // a redelivery: no effect
    let balance: Balance = diesel::sql_query("SELECT cents FROM account")
        .get_result(&mut conn)
        .unwrap();
    assert_eq!(balance.cents, 250);

    // A malformed id is an inbox error, raised before the transaction.
    let bad = Payment {
        id: String::new(),
        cents: 1,
    };
    match apply_payment(&mut conn, &bad) {
        Err(AppError::Inbox(error)) => assert!(error.is_invalid_message()),
        other => panic!("expected an invalid message id, got {other:?}"),
    }
}
