// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
#![deny(warnings)]

//! `outside_transaction = ...` declares a second connection or pool the body
//! uses on purpose (a read replica, an audit record that must survive a
//! rollback). What is written through it is not rolled back with the
//! handler's transaction, and is written again on a redelivery.

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_runtime::{Outcome, idempotent};

type DbPool = Pool<ConnectionManager<SqliteConnection>>;

/// A message.
pub struct Payment {
    /// Its id.
    pub id: String,
}

#[idempotent(id = msg.id, handler = "payments.audited", outside_transaction = audit)]
fn audited(
    conn: &mut SqliteConnection,
    audit: &mut SqliteConnection,
    msg: &Payment,
) -> QueryResult<Outcome<()>> {
    diesel::sql_query("SELECT 1").execute(audit)?;
    diesel::sql_query("SELECT 1").execute(conn)?;
    Ok(Outcome::Processed(()))
}

/// A consumer that keeps a pool for reads outside the transaction.
pub struct Consumer {
    /// The pool.
    pub pool: DbPool,
}

impl Consumer {
    #[idempotent(id = msg.id, handler = "payments.replica", outside_transaction = [pool])]
    fn with_replica(&self, conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
        let mut replica = self.pool.get().expect("a connection");
        diesel::sql_query("SELECT 1").execute(&mut replica)?;
        diesel::sql_query("SELECT 1").execute(conn)?;
        Ok(())
    }
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    let mut audit = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Payment { id: "p-1".into() };
    assert!(audited(&mut conn, &mut audit, &msg).unwrap().is_processed());
    assert!(audited(&mut conn, &mut audit, &msg).unwrap().is_duplicate());
    let pool = Pool::builder()
        .max_size(1)
        .build(ConnectionManager::<SqliteConnection>::new(":memory:"))
        .unwrap();
    Consumer { pool }.with_replica(&mut conn, &msg).unwrap();
}
