use diesel::prelude::*;
use inbox_runtime::{InboxError, idempotent};

diesel::table! {
    accounts (id) {
        id -> BigInt,
        balance -> BigInt,
    }
}

pub struct PaymentReceived {
    pub id: String, // assigned by the producer, the same on every delivery
    pub account: i64,
    pub amount: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
    #[error(transparent)]
    Inbox(#[from] InboxError),
}

#[idempotent(id = msg.id, handler = "billing.apply_payment")]
pub fn apply_payment(conn: &mut PgConnection, msg: &PaymentReceived) -> Result<(), AppError> {
    diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)?;
    Ok(())
}
