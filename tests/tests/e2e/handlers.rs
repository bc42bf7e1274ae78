//! The handlers under test, written once with `#[idempotent]`, generic over
//! the connection: every backend's, and pooled ones.

use diesel::r2d2::{ConnectionManager, PooledConnection, R2D2Connection};
use diesel::{QueryResult, RunQueryDsl};
use inbox_runtime::{Outcome, idempotent};
use inbox_tests::statement;

use crate::support::*;

/// The handler name `apply` (and `gated`) claim under.
pub const APPLY: &str = "e2e.apply";
/// The second handler of the same messages.
pub const AUDIT: &str = "e2e.audit";

/// The workhorse: `()` result, application error type, behaviour
/// chosen by the message's mode.
#[idempotent(id = msg.id, handler = "e2e.apply", shared_scope)]
pub fn apply<C: Effects>(conn: &mut C, msg: &Msg) -> Result<(), AppError> {
    msg.ran();
    if msg.mode == Mode::EarlyReturn {
        return Ok(());
    }
    conn.record_effect(APPLY, &msg.id, 0, "apply")?;
    match msg.mode {
        Mode::Fail => Err(AppError::Failed("the body failed")),
        Mode::Panic => std::panic::panic_any(DeliberatePanic("apply")),
        Mode::RejectWithQuestionMark => {
            msg.check()?;
            unreachable!("the check fails in this mode")
        }
        Mode::DbErrorWithQuestionMark => {
            statement("SELECT no_such_column FROM no_such_table").execute(conn)?;
            unreachable!("the statement fails")
        }
        Mode::Apply | Mode::EarlyReturn => Ok(()),
    }
}

/// Another handler of the same messages: its own deduplication scope.
#[idempotent(id = msg.id, handler = "e2e.audit")]
pub fn audit<C: Effects>(conn: &mut C, msg: &Msg) -> Result<(), AppError> {
    msg.ran();
    conn.record_effect(AUDIT, &msg.id, 0, "audit")?;
    Ok(())
}

/// `Outcome<T>` result; `T` is the id's length in bytes.
#[idempotent(id = msg.id, handler = "e2e.valued")]
pub fn valued<C: Effects>(conn: &mut C, msg: &Msg) -> Result<Outcome<usize>, AppError> {
    msg.ran();
    if msg.mode == Mode::EarlyReturn {
        return Ok(Outcome::Processed(0));
    }
    conn.record_effect("e2e.valued", &msg.id, 0, "valued")?;
    msg.check()?;
    match msg.mode {
        Mode::Fail => Err(AppError::Failed("the body failed")),
        Mode::Panic => std::panic::panic_any(DeliberatePanic("valued")),
        _ => Ok(msg.id.len().into()),
    }
}

/// No `handler = ...`: the name is the function's path.
#[idempotent(id = msg.id)]
pub fn default_named<C: Effects>(conn: &mut C, msg: &Msg) -> Result<(), AppError> {
    msg.ran();
    conn.record_effect("default_named", &msg.id, 0, "default_named")?;
    Ok(())
}

/// The handler name `default_named` should get.
pub const DEFAULT_NAMED: &str = concat!(module_path!(), "::default_named");

/// Plain Diesel error type.
#[idempotent(id = msg.id, handler = "e2e.diesel_typed")]
pub fn diesel_typed<C: Effects>(conn: &mut C, msg: &Msg) -> QueryResult<Outcome<()>> {
    msg.ran();
    conn.record_effect("e2e.diesel_typed", &msg.id, 0, "diesel_typed")?;
    match msg.mode {
        Mode::Fail => Err(diesel::result::Error::NotFound),
        _ => Ok(Outcome::Processed(())),
    }
}

/// Integer ids.
#[idempotent(id = msg.seq, handler = "e2e.numbered")]
pub fn numbered<C: Effects>(conn: &mut C, msg: &Numbered) -> Result<(), AppError> {
    conn.record_effect("e2e.numbered", &msg.seq.to_string(), 0, "numbered")?;
    Ok(())
}

/// UUID ids.
#[idempotent(id = msg.uuid, handler = "e2e.uuided")]
pub fn uuided<C: Effects>(conn: &mut C, msg: &Uuided) -> Result<Outcome<()>, AppError> {
    conn.record_effect("e2e.uuided", &msg.uuid.to_string(), 0, "uuided")?;
    Ok(Outcome::Processed(()))
}

/// An id that may be absent: `msg.id` is an `Option<String>`.
#[idempotent(id = msg.id, handler = "e2e.optional")]
pub fn optional<C: Effects>(conn: &mut C, msg: &Optional) -> Result<(), AppError> {
    msg.ran();
    let id = msg.id.as_deref().expect("the body runs only with an id");
    conn.record_effect("e2e.optional", id, 0, "optional")?;
    Ok(())
}

/// An id read from a header's bytes: `msg.header` is an `Option<Vec<u8>>`.
#[idempotent(id = msg.header.as_deref(), handler = "e2e.header")]
pub fn header<C: Effects>(conn: &mut C, msg: &Optional) -> Result<(), AppError> {
    msg.ran();
    let bytes = msg
        .header
        .as_deref()
        .expect("the body runs only with an id");
    let id = std::str::from_utf8(bytes).expect("the body runs only with UTF-8");
    conn.record_effect("e2e.header", id, 0, "header")?;
    Ok(())
}

/// A pooled connection by `&mut`.
#[idempotent(id = msg.id, handler = "e2e.pooled", shared_scope)]
pub fn pooled_by_ref<C: Effects + R2D2Connection + Send + 'static>(
    conn: &mut PooledConnection<ConnectionManager<C>>,
    msg: &Msg,
) -> Result<Outcome<()>, AppError> {
    msg.ran();
    Effects::record_effect(&mut **conn, "e2e.pooled", &msg.id, 0, "by_ref")?;
    Ok(Outcome::Processed(()))
}

/// A pooled connection moved in (binding without `mut`).
#[idempotent(id = msg.id, handler = "e2e.pooled", shared_scope)]
pub fn pooled_by_value<C: Effects + R2D2Connection + Send + 'static>(
    conn: PooledConnection<ConnectionManager<C>>,
    msg: &Msg,
) -> Result<Outcome<()>, AppError> {
    msg.ran();
    Effects::record_effect(&mut **conn, "e2e.pooled", &msg.id, 0, "by_value")?;
    Ok(Outcome::Processed(()))
}

/// A pooled connection moved in, with a `mut` binding. Inside the
/// body `conn` is the transaction's `&mut PooledConnection`, so the
/// body writes `&mut **conn` for the pooled connection's own: the
/// `&mut *conn` an owned binding would take does not compile under the
/// attribute.
#[idempotent(id = msg.id, handler = "e2e.pooled", shared_scope)]
pub fn pooled_by_mut_value<C: Effects + R2D2Connection + Send + 'static>(
    mut conn: PooledConnection<ConnectionManager<C>>,
    msg: &Msg,
) -> Result<Outcome<()>, AppError> {
    msg.ran();
    Effects::record_effect(&mut **conn, "e2e.pooled", &msg.id, 0, "by_mut_value")?;
    Ok(Outcome::Processed(()))
}

/// Claims under `APPLY`, tells the test, and waits for its verdict.
#[idempotent(id = msg.id, handler = "e2e.apply", shared_scope)]
pub fn gated<C: Effects>(conn: &mut C, msg: &Gated) -> Result<(), AppError> {
    conn.record_effect(APPLY, &msg.id, 0, "gated")?;
    msg.claimed.send(()).expect("the test listens");
    if msg.outcome.recv().expect("the test decides") {
        Ok(())
    } else {
        Err(AppError::Failed("the gated delivery was told to fail"))
    }
}

/// The handler name `nested_transaction` claims under.
pub const NESTED: &str = "e2e.nested_transaction";

/// Opens a Diesel transaction of its own inside the body (a
/// savepoint of the handler's transaction) and, in `Mode::Panic`,
/// panics inside it: Diesel's `transaction` has no unwind guard, so
/// the savepoint is still open when the panic reaches the handler.
#[idempotent(id = msg.id, handler = "e2e.nested_transaction")]
pub fn nested_transaction<C: Effects>(conn: &mut C, msg: &Msg) -> Result<(), AppError> {
    msg.ran();
    conn.record_effect(NESTED, &msg.id, 0, "before the savepoint")?;
    conn.transaction(|conn| {
        conn.record_effect(NESTED, &msg.id, 0, "inside the savepoint")?;
        if msg.mode == Mode::Panic {
            std::panic::panic_any(DeliberatePanic("inside a nested transaction"));
        }
        Ok::<_, AppError>(())
    })
}

/// The handler name `swallows_a_failure` claims under.
pub const SWALLOW: &str = "e2e.swallow";

/// Ignores the error of a failing statement (`let _ = …`) between
/// two effects, then reports success.
#[idempotent(id = msg.id, handler = "e2e.swallow")]
pub fn swallows_a_failure<C: Effects>(conn: &mut C, msg: &Msg) -> Result<Outcome<()>, AppError> {
    msg.ran();
    conn.record_effect(SWALLOW, &msg.id, 0, "before")?;
    if msg.mode == Mode::DbErrorWithQuestionMark {
        let _ = statement("SELECT no_such_column FROM no_such_table").execute(conn);
    }
    // Ignored too: on PostgreSQL it fails once the transaction is aborted.
    let _ = conn.record_effect(SWALLOW, &msg.id, 0, "after");
    Ok(Outcome::Processed(()))
}

/// The race test's handler: one effect row per processed delivery. Its
/// failures stand for transient ones, which a message may meet any number of
/// times: never given up on.
#[idempotent(id = msg.id, handler = "e2e.race", max_attempts = unbounded)]
pub fn race<C: Effects>(conn: &mut C, msg: &RaceDelivery<'_>) -> Result<Outcome<()>, AppError> {
    msg.in_flight
        .store(true, std::sync::atomic::Ordering::SeqCst);
    conn.record_effect("e2e.race", msg.id, msg.worker, "race")?;
    if msg.fail {
        return Err(AppError::Failed("deliberate failure in the race"));
    }
    Ok(Outcome::Processed(()))
}
