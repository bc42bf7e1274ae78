//! The async (diesel-async) twins of the blocking handlers: the same names,
//! limits and bodies.

use diesel_async::{AsyncConnection, RunQueryDsl};
use inbox_runtime::{InboxBackend, InboxError, idempotent};
use inbox_tests::statement;

use crate::handlers::{Act, AppError, Msg};
use crate::support::literal;

/// Dead after three failed attempts.
#[idempotent(id = msg.id, handler = "poison.three", max_attempts = 3, shared_scope)]
pub async fn three_async<C>(conn: &mut C, msg: &Msg) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    act(conn, msg).await
}

/// No limit of its own: the process default (used by `default_limit` only).
#[idempotent(id = msg.id, handler = "poison.defaulted", shared_scope)]
pub async fn defaulted_async<C>(conn: &mut C, msg: &Msg) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    act(conn, msg).await
}

/// Diesel's error type.
#[idempotent(id = msg.id, handler = "poison.diesel_typed", max_attempts = 3, shared_scope)]
pub async fn diesel_typed_async<C>(conn: &mut C, msg: &Msg) -> diesel::QueryResult<()>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    msg.ran();
    write_effect(conn, &msg.id, "diesel_typed").await?;
    match &msg.act {
        Act::Succeed => Ok(()),
        Act::Fail(_) => Err(diesel::result::Error::NotFound),
        Act::Reject(reason) => Err(InboxError::rejected(reason).into()),
        other => unimplemented!("diesel_typed_async does not {other:?}"),
    }
}

/// Runs each statement after its effect; dead after three failed attempts.
#[idempotent(id = msg.id, handler = "poison.scripted", max_attempts = 3, shared_scope)]
pub async fn scripted_async<C>(conn: &mut C, msg: &ScriptedAsync) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    msg.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    write_effect(conn, &msg.id, "scripted").await?;
    for sql in &msg.statements {
        statement(sql.clone()).execute(conn).await?;
    }
    Ok(())
}

/// A delivery whose body runs `statements` after its effect.
pub struct ScriptedAsync {
    pub id: String,
    pub statements: Vec<String>,
    pub runs: std::sync::atomic::AtomicU32,
}

async fn act<C: AsyncConnection>(conn: &mut C, msg: &Msg) -> Result<(), AppError> {
    msg.ran();
    write_effect(conn, &msg.id, "body").await?;
    match &msg.act {
        Act::Succeed => Ok(()),
        Act::Fail(text) => Err(AppError::Failed(text.clone())),
        Act::Panic(text) => panic!("{text}"),
        Act::Reject(reason) => Err(InboxError::rejected(reason).into()),
        Act::PanicAtDepth(1) => {
            conn.transaction(async |conn| {
                write_effect(conn, &msg.id, "nested").await?;
                deliberate_panic();
                Ok::<(), AppError>(())
            })
            .await
        }
        Act::PanicAtDepth(_) => {
            conn.transaction(async |conn| {
                write_effect(conn, &msg.id, "nested").await?;
                conn.transaction(async |conn| {
                    write_effect(conn, &msg.id, "nested").await?;
                    deliberate_panic();
                    Ok::<(), AppError>(())
                })
                .await
            })
            .await
        }
    }
}

fn deliberate_panic() {
    panic!("deliberate panic inside a nested transaction");
}

/// One effect row.
pub async fn write_effect<C: AsyncConnection>(
    conn: &mut C,
    id: &str,
    note: &str,
) -> diesel::QueryResult<()> {
    statement(format!(
        "INSERT INTO poison_effects (message_id, note) VALUES ({}, {})",
        literal(id),
        literal(note)
    ))
    .execute(conn)
    .await
    .map(drop)
}
