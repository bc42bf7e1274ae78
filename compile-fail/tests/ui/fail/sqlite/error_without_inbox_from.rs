use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct AppError(pub diesel::result::Error);

impl From<diesel::result::Error> for AppError {
    fn from(error: diesel::result::Error) -> Self {
        AppError(error)
    }
}

// `AppError` cannot carry an `InboxError` (e.g. a malformed message id).
#[idempotent(id = msg.id)]
pub fn apply_payment(conn: &mut SqliteConnection, msg: &Payment) -> Result<(), AppError> {
    let _ = conn;
    Ok(())
}

fn main() {}
