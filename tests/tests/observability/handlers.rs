//! The handlers under test, generic over the connection, and what they
//! write: one row in `obs_effects` per applied body.

use std::cell::Cell;

use diesel::connection::LoadConnection;
use diesel::query_dsl::methods::ExecuteDsl;
use diesel::{QueryResult, RunQueryDsl};
use inbox_runtime::{InboxBackend, InboxError, idempotent};
use inbox_tests::{AppError, Statement, TestBackend, statement};

/// The handler name of `apply` (and `apply_async`).
pub const APPLY: &str = "obs.apply";
/// The handler name of `limited`.
pub const LIMITED: &str = "obs.limited";
/// The handler name of `fingerprinted`.
pub const FINGERPRINTED: &str = "obs.fingerprinted";

/// The effects table; valid on every backend.
pub const EFFECTS_DDL: &str = "CREATE TABLE obs_effects (message_id VARCHAR(255) NOT NULL)";

/// How a body behaves on this delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Writes its effect and succeeds.
    Apply,
    /// Writes its effect, then fails with the application's own error.
    Fail,
    /// Writes its effect, then panics.
    Panic,
    /// Rejects the message (`InboxError::rejected`).
    Reject,
    /// Runs a failing statement, ignores its error and returns `Ok`: on
    /// PostgreSQL the commit then fails.
    IgnoreFailedStatement,
}

/// A delivered message.
pub struct Msg {
    pub id: String,
    pub mode: Mode,
    pub runs: Cell<u32>,
}

impl Msg {
    pub fn new(id: &str, mode: Mode) -> Msg {
        Msg {
            id: id.to_owned(),
            mode,
            runs: Cell::new(0),
        }
    }
}

/// What a body needs of its connection.
pub trait Effects: LoadConnection<Backend: InboxBackend> {
    fn effect(&mut self, sql: &str) -> QueryResult<usize>;
}

impl<C> Effects for C
where
    C: LoadConnection<Backend: InboxBackend>,
    Statement: ExecuteDsl<C>,
{
    fn effect(&mut self, sql: &str) -> QueryResult<usize> {
        statement(sql).execute(self)
    }
}

fn insert_effect(id: &str) -> String {
    format!("INSERT INTO obs_effects (message_id) VALUES ('{id}')")
}

/// The body every test drives: logs, writes its effect, then behaves as the
/// message asks.
#[idempotent(id = msg.id, handler = "obs.apply", shared_scope)]
pub fn apply<C: Effects>(conn: &mut C, msg: &Msg) -> Result<(), AppError> {
    msg.runs.set(msg.runs.get() + 1);
    tracing::info!(name: "body", "in the body");
    conn.effect(&insert_effect(&msg.id))?;
    match msg.mode {
        Mode::Apply => Ok(()),
        Mode::Fail => Err(AppError::Failed("boom")),
        Mode::Panic => panic!("deliberate panic in the body"),
        Mode::Reject => Err(InboxError::rejected("unknown sku").into()),
        Mode::IgnoreFailedStatement => {
            let _ = conn.effect("SELECT no_such_column FROM no_such_table");
            Ok(())
        }
    }
}

/// Always fails; two failed attempts make a message dead.
#[idempotent(id = msg.id, handler = "obs.limited", max_attempts = 2)]
pub fn limited<C: Effects>(conn: &mut C, msg: &Msg) -> Result<(), AppError> {
    msg.runs.set(msg.runs.get() + 1);
    conn.effect(&insert_effect(&msg.id))?;
    Err(AppError::Failed("boom"))
}

/// A fresh database of `B` with the effects table.
pub fn fresh<B: TestBackend>() -> Option<(B, B::Connection)> {
    let db = B::open()?;
    let mut conn = db.connect();
    statement(EFFECTS_DDL)
        .execute(&mut conn)
        .expect("create obs_effects");
    Some((db, conn))
}

#[cfg(feature = "async")]
pub use self::asynchronous::*;

#[cfg(feature = "async")]
mod asynchronous {
    use diesel_async::AsyncConnection;
    use inbox_runtime::{InboxBackend, InboxError, idempotent};
    use inbox_tests::{AppError, statement};

    use super::{Mode, Msg, insert_effect};

    /// `apply`'s async twin (same handler name), awaiting inside its body.
    #[idempotent(id = msg.id, handler = "obs.apply", shared_scope)]
    pub async fn apply_async<C>(conn: &mut C, msg: &Msg) -> Result<(), AppError>
    where
        C: AsyncConnection<Backend: InboxBackend>,
    {
        msg.runs.set(msg.runs.get() + 1);
        tokio::task::yield_now().await;
        tracing::info!(name: "body", "in the body");
        diesel_async::RunQueryDsl::execute(statement(insert_effect(&msg.id)), conn).await?;
        match msg.mode {
            Mode::Apply => Ok(()),
            Mode::Fail => Err(AppError::Failed("boom")),
            Mode::Reject => Err(InboxError::rejected("unknown sku").into()),
            Mode::Panic | Mode::IgnoreFailedStatement => unimplemented!("not used async"),
        }
    }
}

/// A message with a payload.
pub struct Payload {
    pub id: String,
    pub body: String,
}

/// Applies a payload; the same id with another body is a conflict.
#[idempotent(id = msg.id, handler = "obs.fingerprinted", fingerprint = msg.body)]
pub fn fingerprinted<C: Effects>(conn: &mut C, msg: &Payload) -> Result<(), AppError> {
    conn.effect(&insert_effect(&msg.id))?;
    Ok(())
}
