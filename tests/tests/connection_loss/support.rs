//! What the connection-loss tests share: where the kill lands, how a caller
//! classifies the error it got, a bounded wait that fails on a hang, and the
//! table of server errors the classification tests fill and check.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use diesel::result::Error;
use inbox_runtime::Recovery;

pub use inbox_tests::AppError;

/// What the handler bodies write: one row per effect, no unique key, so an
/// effect applied twice shows up twice. Valid on PostgreSQL and MariaDB alike.
pub const EFFECTS_DDL: &str = "CREATE TABLE loss_effects \
     (message_id VARCHAR(255) NOT NULL, note VARCHAR(64) NOT NULL)";

/// The statement that records effect `note` of message `id`.
pub fn effect_sql(id: &str, note: &str) -> String {
    format!("INSERT INTO loss_effects (message_id, note) VALUES ('{id}', '{note}')")
}

/// How many inbox rows message `id` has (a `BIGINT` `value`).
pub fn claims_sql(id: &str) -> String {
    format!("SELECT COUNT(*) AS value FROM inbox_messages WHERE message_id = '{id}'")
}

/// The notes of message `id`'s effects (a text `value`).
pub fn notes_sql(id: &str) -> String {
    format!("SELECT note AS value FROM loss_effects WHERE message_id = '{id}'")
}

/// How long a statement on a killed connection may take before the test
/// calls it a hang. Generous: the machine is shared; a hang never ends.
pub const HANG: Duration = Duration::from_secs(30);

/// Where the consumer's own connection is terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillAt {
    /// Between the body's two effects: the body's next statement meets a
    /// dead connection.
    MidBody,
    /// After the body's last statement, right before it returns `Ok`: the
    /// handler's own `COMMIT` is the first thing to meet the dead connection.
    BeforeCommit,
    /// The handler runs nested in a transaction its caller opened on the
    /// same connection and releases its savepoint; the connection is killed
    /// after that, before the caller's `COMMIT`.
    CallerCommit,
}

/// What the caller of a handler does with its error: the inbox's answer.
pub fn classify(error: &AppError) -> Recovery {
    if let AppError::Failed(why) = error {
        panic!("an application error, not a database one: {why}");
    }
    error.recovery()
}

/// The Diesel error a handler's error carries (for printing what the driver
/// said).
pub fn diesel_error(error: &AppError) -> Option<&Error> {
    match error {
        AppError::Db(error) => Some(error),
        AppError::Inbox(error) => std::error::Error::source(error)?.downcast_ref(),
        AppError::Failed(_) => None,
    }
}

/// `kind: message` for a driver's database error, the error's `Debug`
/// otherwise.
pub fn describe(error: &Error) -> String {
    match error {
        Error::DatabaseError(kind, info) => format!("{kind:?}: {:?}", info.message()),
        other => format!("{other:?}"),
    }
}

/// Runs `work` on a thread of its own and returns its value, or fails the
/// test when it has not finished after [`HANG`].
pub fn within<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(work());
    });
    match result.recv_timeout(HANG) {
        Ok(value) => value,
        Err(RecvTimeoutError::Timeout) => panic!("{what}: still waiting after {HANG:?} (a hang)"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: the work panicked"),
    }
}

/// One real failure and what the inbox says about it.
pub struct Seen {
    pub case: &'static str,
    pub driver_said: String,
    pub expected: Recovery,
    pub got: Recovery,
}

/// The failures one classification test produced, checked together so that
/// every mismatch is reported, not only the first.
#[derive(Default)]
pub struct Findings {
    pub rows: Vec<Seen>,
}

impl Findings {
    /// Records `error`, a Diesel error produced for real by `case`.
    pub fn diesel(&mut self, case: &'static str, error: &Error, expected: Recovery) {
        self.rows.push(Seen {
            case,
            driver_said: describe(error),
            expected,
            got: inbox_runtime::recovery(error),
        });
    }

    /// Records `error`, a handler's error produced for real by `case`.
    pub fn handler(&mut self, case: &'static str, error: &AppError, expected: Recovery) {
        let driver_said = match (error, diesel_error(error)) {
            (AppError::Inbox(inbox), Some(source)) => {
                format!("{} <- {}", inbox_variant(inbox), describe(source))
            }
            (AppError::Inbox(inbox), None) => format!("{inbox:?}"),
            (_, Some(source)) => describe(source),
            (other, None) => format!("{other:?}"),
        };
        self.rows.push(Seen {
            case,
            driver_said,
            expected,
            got: classify(error),
        });
    }

    /// Prints the table and fails on any row whose answer is not the
    /// expected one.
    pub fn check(self, title: &str) {
        let mut wrong = Vec::new();
        println!("{title}:");
        for row in &self.rows {
            let mark = if row.got == row.expected {
                "ok "
            } else {
                "BAD"
            };
            println!(
                "  {mark} {:<44} {:?} (expected {:?}) <- {}",
                row.case, row.got, row.expected, row.driver_said
            );
            if row.got != row.expected {
                wrong.push(format!(
                    "{}: {:?}, expected {:?}, from {}",
                    row.case, row.got, row.expected, row.driver_said
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "{title}: misclassified:\n{}",
            wrong.join("\n")
        );
    }
}

/// The variant's name of an inbox error (`TransactionLost { nested: false }`
/// and its source are printed apart).
fn inbox_variant(error: &inbox_runtime::InboxError) -> String {
    let debug = format!("{error:?}");
    let name = debug
        .split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_owned();
    if name == "TransactionLost" {
        let nested = debug.contains("nested: true");
        format!("TransactionLost {{ nested: {nested} }}")
    } else {
        name
    }
}
