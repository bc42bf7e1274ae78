//! The registration `#[idempotent]` emits compiles in a crate that forbids
//! unsafe code (edition 2024), for every kind of handler: a free function,
//! a generic one (registered once, not per instance, and also when never
//! called), a method, a trait impl's method, a function in a module, and
//! the default scope; and the registry lists them all.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
#![forbid(unsafe_code)]
#![deny(warnings)]

use diesel::connection::LoadConnection;
use diesel::prelude::*;
use inbox_runtime::{InboxBackend, idempotent, registry};

#[idempotent(id = id, handler = "ui.free", max_attempts = 3)]
fn free(conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(id = id, handler = "ui.generic", fingerprint = id)]
fn generic<C: LoadConnection<Backend: InboxBackend>>(conn: &mut C, id: &str) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

#[idempotent(id = id, handler = "ui.never_called")]
fn never_called<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    id: &str,
) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

struct Ledger;

impl Ledger {
    #[idempotent(id = id, handler = "ui.method")]
    fn post(&self, conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
        let _ = conn;
        Ok(())
    }
}

trait Consumer {
    fn consume(&self, conn: &mut SqliteConnection, id: &str) -> QueryResult<()>;
}

impl Consumer for Ledger {
    #[idempotent(id = id, handler = "ui.trait_method")]
    fn consume(&self, conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
        let _ = conn;
        Ok(())
    }
}

mod nested {
    use diesel::prelude::*;
    use inbox_runtime::idempotent;

    #[idempotent(id = id)]
    pub fn defaulted(conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
        let _ = conn;
        Ok(())
    }
}

fn main() {
    let _ = never_called::<SqliteConnection>;
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();
    free(&mut conn, "m-1").unwrap();
    generic(&mut conn, "m-1").unwrap();
    Ledger.post(&mut conn, "m-1").unwrap();
    Ledger.consume(&mut conn, "m-1").unwrap();
    nested::defaulted(&mut conn, "m-1").unwrap();

    registry::check().unwrap();
    // The default scope is the function's path, which starts with this
    // crate's name (sorted before or after the others, by that name).
    let mut scopes: Vec<&str> = registry::handlers().iter().map(|h| h.scope()).collect();
    let defaulted = scopes
        .iter()
        .position(|scope| scope.ends_with("::nested::defaulted"))
        .unwrap_or_else(|| panic!("no default scope: {scopes:?}"));
    scopes.remove(defaulted);
    assert_eq!(
        scopes,
        [
            "ui.free",
            "ui.generic",
            "ui.method",
            "ui.never_called",
            "ui.trait_method",
        ]
    );
    let free = registry::find("ui.free").next().unwrap();
    assert_eq!(free.line(), 16);
    assert!(free.function().ends_with("::free"));
}
