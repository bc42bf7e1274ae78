//! An error type written by hand that converts the inbox's errors but does
//! not return them from `source()` compiles; `registry::check()` reports it
//! at start-up (with what it hides), and the testing helpers refuse to
//! pass. A type that carries them, a generic return type (not probed) and
//! Diesel's own error are not reported.
// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
// `half` is registered and checked, never called.
#![allow(dead_code)]
use std::fmt;

use diesel::prelude::*;
use inbox_runtime::testing::{IdempotenceViolation, check_idempotent};
use inbox_runtime::{AckDecision, InboxError, ack_decision, idempotent, registry};

/// Converts both errors and keeps them, but `source()` returns nothing.
#[derive(Debug)]
enum PayError {
    Db(#[allow(dead_code)] diesel::result::Error),
    Inbox(#[allow(dead_code)] InboxError),
}

impl From<diesel::result::Error> for PayError {
    fn from(error: diesel::result::Error) -> Self {
        PayError::Db(error)
    }
}

impl From<InboxError> for PayError {
    fn from(error: InboxError) -> Self {
        PayError::Inbox(error)
    }
}

impl fmt::Display for PayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("payment failed")
    }
}

impl std::error::Error for PayError {}

/// The same, carrying the database error only.
#[derive(Debug)]
enum HalfError {
    Db(diesel::result::Error),
    Inbox(#[allow(dead_code)] InboxError),
}

impl From<diesel::result::Error> for HalfError {
    fn from(error: diesel::result::Error) -> Self {
        HalfError::Db(error)
    }
}

impl From<InboxError> for HalfError {
    fn from(error: InboxError) -> Self {
        HalfError::Inbox(error)
    }
}

impl fmt::Display for HalfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("half")
    }
}

impl std::error::Error for HalfError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HalfError::Db(error) => Some(error),
            HalfError::Inbox(_) => None,
        }
    }
}

#[idempotent(id = id, handler = "ui.hidden.pay")]
fn pay(conn: &mut SqliteConnection, id: Option<&str>) -> Result<(), PayError> {
    let _ = conn;
    Ok(())
}

#[idempotent(id = id, handler = "ui.hidden.half")]
fn half(conn: &mut SqliteConnection, id: &str) -> Result<(), HalfError> {
    let _ = conn;
    Ok(())
}

#[idempotent(id = id, handler = "ui.hidden.diesel")]
fn plain(conn: &mut SqliteConnection, id: &str) -> QueryResult<()> {
    let _ = conn;
    Ok(())
}

/// Generic over its error type: the registration cannot name it.
#[idempotent(id = id, handler = "ui.hidden.generic")]
fn generic<E: From<diesel::result::Error> + From<InboxError> + std::error::Error + 'static>(
    conn: &mut SqliteConnection,
    id: &str,
) -> Result<(), E> {
    let _ = conn;
    Ok(())
}

fn main() {
    let mut conn = SqliteConnection::establish(":memory:").unwrap();
    inbox_runtime::setup(&mut conn).unwrap();

    // What a consumer would see: a message without an id is answered
    // `Retry`, not `DeadLetter`, through the hiding type.
    let missing = pay(&mut conn, None);
    assert_eq!(ack_decision(&missing), AckDecision::Retry);

    let problems = registry::check().unwrap_err();
    assert!(problems.shared_scopes.is_empty());
    let hidden: Vec<(&str, bool, bool)> = problems
        .hidden_errors
        .iter()
        .map(|hidden| {
            (
                hidden.handler.scope(),
                hidden.error_type.carries_inbox_errors(),
                hidden.error_type.carries_database_errors(),
            )
        })
        .collect();
    assert_eq!(
        hidden,
        [
            ("ui.hidden.half", false, true),
            ("ui.hidden.pay", false, false)
        ]
    );
    let report = problems.to_string();
    assert!(
        report.contains("2 handlers have an error type that hides"),
        "{report}"
    );
    assert!(
        report.contains("PayError` hides the inbox's errors and database errors"),
        "{report}"
    );
    assert!(report.contains("from `source()`"), "{report}");

    let find = |scope| registry::find(scope).next().unwrap().error_type();
    assert!(find("ui.hidden.diesel").unwrap().is_transparent());
    assert_eq!(find("ui.hidden.generic"), None);
    let _ = generic::<diesel::result::Error>;

    // The testing helper refuses before delivering anything.
    let violation = check_idempotent(&mut conn, |conn| plain(conn, "m-1")).unwrap_err();
    assert!(
        matches!(&violation, IdempotenceViolation::HiddenErrors { handlers } if handlers.len() == 2)
    );
    let text = violation.to_string();
    assert!(
        text.starts_with("handlers of the program would misread"),
        "{text}"
    );
    assert!(
        text.contains("::pay (") && text.contains("PayError"),
        "{text}"
    );
}
