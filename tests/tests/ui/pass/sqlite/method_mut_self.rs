// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use diesel::prelude::*;
use inbox_runtime::idempotent;

pub struct Payment {
    pub id: String,
    pub cents: i64,
}

pub struct Totals {
    cents: i64,
}

impl Totals {
    #[idempotent(id = msg.id, handler = "totals.add")]
    pub fn add(&mut self, conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
        let _ = conn;
        self.cents += msg.cents;
        Ok(())
    }

    // `self` by value, and `Self` in the signature.
    #[idempotent(id = msg.id, handler = "totals.into_sum")]
    pub fn merged(
        self,
        conn: &mut SqliteConnection,
        msg: &Payment,
    ) -> QueryResult<inbox_runtime::Outcome<Self>> {
        let _ = conn;
        Ok(Totals {
            cents: self.cents + msg.cents,
        }
        .into())
    }
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let mut totals = Totals { cents: 0 };
    let msg = Payment {
        id: "p-1".into(),
        cents: 5,
    };
    totals.add(&mut conn, &msg).unwrap();
    totals.add(&mut conn, &msg).unwrap();
    assert_eq!(totals.cents, 5);
    let merged = totals.merged(&mut conn, &msg).unwrap().processed().unwrap();
    assert_eq!(merged.cents, 10);
}
