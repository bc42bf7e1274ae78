use diesel::prelude::*;
use inbox_runtime::idempotent;
use inbox_runtime::testing::{Idempotence, assert_idempotent};

pub struct Deposit {
    pub id: String,
    pub cents: i64,
}

#[idempotent(id = msg.id, handler = "bank.deposit")]
pub fn deposit(conn: &mut SqliteConnection, msg: &Deposit) -> QueryResult<()> {
    diesel::sql_query("UPDATE account SET cents = cents + ?")
        .bind::<diesel::sql_types::BigInt, _>(msg.cents)
        .execute(conn)?;
    Ok(())
}

#[test]
fn deposit_is_idempotent() -> Result<(), Box<dyn std::error::Error>> {
    let mut conn = SqliteConnection::establish(":memory:")?; // your test database
    inbox_runtime::setup(&mut conn)?;
    diesel::sql_query("CREATE TABLE account (cents BIGINT NOT NULL)").execute(&mut conn)?;
    diesel::sql_query("INSERT INTO account VALUES (0)").execute(&mut conn)?;

    let msg = Deposit {
        id: "dep-1".into(),
        cents: 250,
    };
    assert_idempotent(&mut conn, |conn| deposit(conn, &msg));

    // Or compare only some tables (the claim in inbox_messages is still counted):
    let msg = Deposit {
        id: "dep-2".into(),
        cents: 100,
    };
    Idempotence::new()
        .tables(["account"])
        .assert(&mut conn, |conn| deposit(conn, &msg));
    Ok(())
}
