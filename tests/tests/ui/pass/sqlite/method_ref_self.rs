// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
use std::cell::Cell;

use diesel::prelude::*;
use inbox_runtime::{Outcome, idempotent};

pub struct Payment {
    pub id: String,
}

pub struct Billing {
    processed: Cell<u32>,
}

pub struct Audit {
    processed: Cell<u32>,
}

// Methods name their scope: `Billing::handle` and `Audit::handle` live in the
// same module and would otherwise share one.
impl Billing {
    #[idempotent(id = msg.id, handler = "billing.handle")]
    pub fn handle(&self, conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<()> {
        let _ = conn;
        self.processed.set(self.processed.get() + 1);
        Ok(())
    }
}

impl Audit {
    #[idempotent(id = msg.id, handler = "audit.handle")]
    pub fn handle(&self, conn: &mut SqliteConnection, msg: &Payment) -> QueryResult<Outcome<u32>> {
        let _ = conn;
        self.processed.set(self.processed.get() + 1);
        Ok(Outcome::Processed(self.processed.get()))
    }
}

pub struct Keyed {
    key: String,
}

impl Keyed {
    // The id may come from `self`, too.
    #[idempotent(id = self.key, handler = "keyed.handle")]
    pub fn handle(&self, conn: &mut SqliteConnection) -> QueryResult<()> {
        let _ = conn;
        Ok(())
    }
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    let billing = Billing {
        processed: Cell::new(0),
    };
    let audit = Audit {
        processed: Cell::new(0),
    };
    let msg = Payment { id: "p-1".into() };
    for _ in 0..3 {
        billing.handle(&mut conn, &msg).unwrap();
        let _ = audit.handle(&mut conn, &msg).unwrap();
    }
    assert_eq!(billing.processed.get(), 1);
    assert_eq!(audit.processed.get(), 1);
    Keyed { key: "k".into() }.handle(&mut conn).unwrap();
}
