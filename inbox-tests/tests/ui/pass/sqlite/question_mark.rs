use diesel::prelude::*;
use inbox_runtime::{idempotent, InboxError, Outcome};

pub struct Transfer {
    pub id: String,
    pub amount: &'static str,
}

#[derive(Debug)]
pub enum AppError {
    Database(diesel::result::Error),
    Inbox(InboxError),
    Parse(std::num::ParseIntError),
}

impl From<diesel::result::Error> for AppError {
    fn from(error: diesel::result::Error) -> Self {
        AppError::Database(error)
    }
}

impl From<InboxError> for AppError {
    fn from(error: InboxError) -> Self {
        AppError::Inbox(error)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(error: std::num::ParseIntError) -> Self {
        AppError::Parse(error)
    }
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
