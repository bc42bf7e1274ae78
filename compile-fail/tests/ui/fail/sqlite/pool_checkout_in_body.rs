//! A connection taken from a pool inside the body (here a pool the consumer
//! holds): reported at the checkout.

use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

pub struct Consumer {
    pub pool: Pool<ConnectionManager<SqliteConnection>>,
}

impl Consumer {
    #[idempotent(id = msg.id, handler = "billing.apply_payment")]
    pub fn apply_payment(&self, conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
        diesel::sql_query("SELECT 1").execute(conn)?;
        let mut other = self.pool.get().expect("a connection");
        diesel::sql_query("SELECT 2").execute(&mut other)?;
        Ok(())
    }
}

fn main() {}
