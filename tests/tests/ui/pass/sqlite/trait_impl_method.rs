// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::{InboxError, idempotent};

pub struct Payment {
    pub id: String,
}

#[derive(Debug, thiserror::Error)]
#[error("the application failed")]
pub struct AppError;

impl From<diesel::result::Error> for AppError {
    fn from(_: diesel::result::Error) -> Self {
        AppError
    }
}

impl From<InboxError> for AppError {
    fn from(_: InboxError) -> Self {
        AppError
    }
}

pub trait Handler<M> {
    type Error;
    fn handle(&self, conn: &mut SqliteConnection, msg: &M) -> Result<(), Self::Error>;
}

pub struct Billing;

// The attribute keeps the signature, so the method still implements the trait.
impl Handler<Payment> for Billing {
    type Error = AppError;

    #[idempotent(id = msg.id, handler = "billing.payment")]
    fn handle(&self, conn: &mut SqliteConnection, msg: &Payment) -> Result<(), Self::Error> {
        diesel::sql_query("SELECT 1").execute(conn)?;
        Ok(())
    }
}

fn dispatch<H: Handler<Payment>>(
    handler: &H,
    conn: &mut SqliteConnection,
    msg: &Payment,
) -> Result<(), H::Error> {
    handler.handle(conn, msg)
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let msg = Payment { id: "p-1".into() };
    dispatch(&Billing, &mut conn, &msg).unwrap();
    let boxed: Box<dyn Handler<Payment, Error = AppError>> = Box::new(Billing);
    boxed.handle(&mut conn, &msg).unwrap();
}
