use diesel::SqliteConnection;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
}

pub struct Billing;
pub struct Audit;

// Both would default to the scope `method_without_explicit_handler::handle`:
// whichever ran first would make the other skip the message.
impl Billing {
    #[idempotent(id = msg.id)]
    pub fn handle(&self, conn: &mut SqliteConnection, msg: &Payment) -> diesel::QueryResult<()> {
        let _ = (conn, msg);
        Ok(())
    }
}

impl Audit {
    #[idempotent(id = msg.id)]
    pub fn handle(
        &mut self,
        conn: &mut SqliteConnection,
        msg: &Payment,
    ) -> diesel::QueryResult<()> {
        let _ = (conn, msg);
        Ok(())
    }
}

// No receiver, but `Self` in the signature: an associated function of some type.
impl Payment {
    #[idempotent(id = msg.id)]
    pub fn apply(conn: &mut SqliteConnection, msg: &Self) -> diesel::QueryResult<()> {
        let _ = (conn, msg);
        Ok(())
    }
}

fn main() {}
