// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{InboxError, Outcome, idempotent};

pub struct Transfer {
    pub id: String,
    pub amount: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
    #[error(transparent)]
    Inbox(#[from] InboxError),
    #[error("bad amount: {0}")]
    Parse(#[from] std::num::ParseIntError),
}

// `?` converts into the handler's error type, as it would without the
// attribute; an `Err` rolls the claim back, so a redelivery runs again.
#[idempotent(id = msg.id)]
fn transfer(conn: &mut SqliteConnection, msg: &Transfer) -> Result<Outcome<i64>, AppError> {
    diesel::sql_query("INSERT INTO transfers VALUES (1)").execute(conn)?;
    let amount: i64 = msg.amount.parse()?;
    Ok(Outcome::Processed(amount))
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    diesel::sql_query("CREATE TABLE transfers (n INTEGER NOT NULL)")
        .execute(&mut conn)
        .unwrap();

    let bad = Transfer {
        id: "t-1".into(),
        amount: "ten",
    };
    assert!(matches!(transfer(&mut conn, &bad), Err(AppError::Parse(_))));
    // The failed delivery left nothing behind: the same id is processed now.
    let good = Transfer {
        id: "t-1".into(),
        amount: "10",
    };
    assert_eq!(transfer(&mut conn, &good).unwrap(), Outcome::Processed(10));
    assert_eq!(transfer(&mut conn, &good).unwrap(), Outcome::Duplicate);
    let rows = diesel::sql_query("SELECT n FROM transfers")
        .execute(&mut conn)
        .unwrap();
    let _ = rows;
}
