//! `#[async_trait]` has already turned the method into a boxed future by the
//! time `#[idempotent]` sees it; the attribute refuses it and says what to
//! write instead.

use diesel::prelude::*;
use diesel_async::AsyncPgConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[async_trait::async_trait]
pub trait Handler {
    async fn handle(&self, conn: &mut AsyncPgConnection, msg: &Payment) -> QueryResult<()>;
}

pub struct Billing;

#[async_trait::async_trait]
impl Handler for Billing {
    #[idempotent(id = msg.id, handler = "billing.handle")]
    async fn handle(&self, conn: &mut AsyncPgConnection, msg: &Payment) -> QueryResult<()> {
        let _ = conn;
        Ok(())
    }
}

fn main() {}
