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

#[derive(Debug)]
pub enum AppError {
    Db(diesel::result::Error),
    Inbox(InboxError),
}

impl From<diesel::result::Error> for AppError {
    fn from(error: diesel::result::Error) -> Self {
        AppError::Db(error)
    }
}

impl From<InboxError> for AppError {
    fn from(error: InboxError) -> Self {
        AppError::Inbox(error)
    }
}

#[idempotent(id = msg.id, handler = "billing.apply_payment")]
pub fn apply_payment(conn: &mut PgConnection, msg: &PaymentReceived) -> Result<(), AppError> {
    diesel::update(accounts::table.find(msg.account))
        .set(accounts::balance.eq(accounts::balance + msg.amount))
        .execute(conn)?;
    Ok(())
}
