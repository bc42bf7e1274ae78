use diesel::SqliteConnection;
use inbox_runtime::{idempotent, InboxError};

pub struct Payment {
    pub id: String,
}

// Takes both errors, but is not a `std::error::Error`: the runtime could
// not tell a rejection or a database failure from the handler's own error.
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

#[idempotent(id = msg.id)]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> Result<(), AppError> {
    let _ = (conn, msg);
    Ok(())
}

fn main() {}
