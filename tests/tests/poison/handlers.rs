//! The blocking handlers under test, written once with `#[idempotent]`,
//! generic over the connection. Each body writes one effect row first, then
//! does what the message says, so an effect that survives a failure shows.

use std::sync::atomic::{AtomicU32, Ordering};

use diesel::connection::LoadConnection;
use diesel::prelude::*;
use inbox_runtime::{InboxBackend, InboxError, idempotent};
use inbox_tests::statement;

use crate::support::literal;

/// The application error type: Diesel's and the inbox's errors wrapped
/// transparently (`ack_decision` sees through them), and the application's
/// own failure with a text of its choosing.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
    #[error(transparent)]
    Inbox(#[from] InboxError),
    #[error("{0}")]
    Failed(String),
}

impl AppError {
    /// The inbox error inside, if that is what this is.
    pub fn inbox(&self) -> Option<&InboxError> {
        match self {
            AppError::Inbox(error) => Some(error),
            _ => None,
        }
    }
}

/// What a body does after writing its effect.
#[derive(Debug, Clone)]
pub enum Act {
    /// Returns `Ok`.
    Succeed,
    /// Returns the application's own error with this text.
    Fail(String),
    /// Panics with this text (which must say `deliberate`).
    Panic(String),
    /// Returns `InboxError::rejected(reason)`.
    Reject(String),
    /// Opens this many nested Diesel transactions, writing an effect in
    /// each, and panics in the innermost.
    PanicAtDepth(u32),
}

/// A delivery of message `id`; `runs` counts the bodies that ran for it.
#[derive(Debug)]
pub struct Msg {
    pub id: String,
    pub act: Act,
    pub runs: AtomicU32,
}

impl Msg {
    pub fn new(id: &str, act: Act) -> Self {
        Msg {
            id: id.to_owned(),
            act,
            runs: AtomicU32::new(0),
        }
    }

    pub fn succeeding(id: &str) -> Self {
        Msg::new(id, Act::Succeed)
    }

    pub fn failing(id: &str, text: &str) -> Self {
        Msg::new(id, Act::Fail(text.to_owned()))
    }

    pub fn panicking(id: &str, text: &str) -> Self {
        Msg::new(id, Act::Panic(format!("deliberate panic: {text}")))
    }

    pub fn rejecting(id: &str, reason: &str) -> Self {
        Msg::new(id, Act::Reject(reason.to_owned()))
    }

    pub fn ran(&self) {
        self.runs.fetch_add(1, Ordering::SeqCst);
    }

    pub fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

/// The names the handlers claim under.
pub const THREE: &str = "poison.three";
pub const UNBOUNDED: &str = "poison.unbounded";
pub const DEFAULTED: &str = "poison.defaulted";
pub const DIESEL_TYPED: &str = "poison.diesel_typed";
pub const SCRIPTED: &str = "poison.scripted";

/// Dead after three failed attempts.
#[idempotent(id = msg.id, handler = "poison.three", max_attempts = 3, shared_scope)]
pub fn three<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    msg: &Msg,
) -> Result<(), AppError> {
    act(conn, msg)
}

/// Never dead.
#[idempotent(id = msg.id, handler = "poison.unbounded", max_attempts = unbounded)]
pub fn unbounded<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    msg: &Msg,
) -> Result<(), AppError> {
    act(conn, msg)
}

/// No limit of its own: the process default (used by `default_limit` only).
#[idempotent(id = msg.id, handler = "poison.defaulted", shared_scope)]
pub fn defaulted<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    msg: &Msg,
) -> Result<(), AppError> {
    act(conn, msg)
}

/// Diesel's error type: a failure is `NotFound`, a rejection travels inside
/// a `QueryBuilderError`.
#[idempotent(id = msg.id, handler = "poison.diesel_typed", max_attempts = 3, shared_scope)]
pub fn diesel_typed<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    msg: &Msg,
) -> QueryResult<()> {
    msg.ran();
    write_effect(conn, &msg.id, "diesel_typed")?;
    match &msg.act {
        Act::Succeed => Ok(()),
        Act::Fail(_) => Err(diesel::result::Error::NotFound),
        Act::Reject(reason) => Err(InboxError::rejected(reason).into()),
        other => unimplemented!("diesel_typed does not {other:?}"),
    }
}

/// One step of a scripted body.
pub enum Step<'a> {
    /// A statement; its error ends the body through `?`.
    Sql(String),
    /// Something the test does while the body runs (on another connection).
    Call(Box<dyn Fn() + Send + Sync + 'a>),
    /// Ends the body with the application's own error.
    Fail(String),
    /// A statement whose error the body drops (`let _ = …`).
    Ignored(String),
    /// A statement in a `conn.transaction` of the body's own (a savepoint);
    /// its error ends the body through `?`.
    InTransaction(String),
}

/// A delivery whose body runs `steps` after its effect.
pub struct Scripted<'a> {
    pub id: String,
    pub steps: Vec<Step<'a>>,
    pub runs: AtomicU32,
}

impl<'a> Scripted<'a> {
    pub fn new(id: &str, steps: Vec<Step<'a>>) -> Self {
        Scripted {
            id: id.to_owned(),
            steps,
            runs: AtomicU32::new(0),
        }
    }

    pub fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

/// Runs the delivery's script, dead after three failed attempts.
#[idempotent(id = msg.id, handler = "poison.scripted", max_attempts = 3, shared_scope)]
pub fn scripted<C: LoadConnection<Backend: InboxBackend>>(
    conn: &mut C,
    msg: &Scripted<'_>,
) -> Result<(), AppError> {
    msg.runs.fetch_add(1, Ordering::SeqCst);
    write_effect(conn, &msg.id, "scripted")?;
    for step in &msg.steps {
        match step {
            Step::Sql(sql) => {
                statement(sql.clone()).execute(conn)?;
            }
            Step::Call(call) => call(),
            Step::Fail(text) => return Err(AppError::Failed(text.clone())),
            Step::Ignored(sql) => {
                let _ignored = statement(sql.clone()).execute(conn);
            }
            Step::InTransaction(sql) => {
                conn.transaction(|conn| statement(sql.clone()).execute(conn))?;
            }
        }
    }
    Ok(())
}

/// The bodies of `three`, `unbounded` and `defaulted`.
fn act<C: Connection>(conn: &mut C, msg: &Msg) -> Result<(), AppError> {
    msg.ran();
    write_effect(conn, &msg.id, "body")?;
    match &msg.act {
        Act::Succeed => Ok(()),
        Act::Fail(text) => Err(AppError::Failed(text.clone())),
        Act::Panic(text) => panic!("{text}"),
        Act::Reject(reason) => Err(InboxError::rejected(reason).into()),
        Act::PanicAtDepth(depth) => panic_at_depth(conn, &msg.id, *depth),
    }
}

fn panic_at_depth<C: Connection>(conn: &mut C, id: &str, depth: u32) -> Result<(), AppError> {
    if depth == 0 {
        panic!("deliberate panic inside a nested transaction");
    }
    conn.transaction(|conn| {
        write_effect(conn, id, "nested")?;
        panic_at_depth(conn, id, depth - 1)
    })
}

/// One effect row.
pub fn write_effect<C: Connection>(conn: &mut C, id: &str, note: &str) -> QueryResult<()> {
    statement(format!(
        "INSERT INTO poison_effects (message_id, note) VALUES ({}, {})",
        literal(id),
        literal(note)
    ))
    .execute(conn)
    .map(drop)
}
