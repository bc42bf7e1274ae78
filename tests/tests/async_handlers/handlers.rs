//! The handlers under test, each written once, generic over the connection:
//! what their bodies write is one row per applied effect in
//! `async_effects`, which has no unique constraint, so a second effect for a
//! message shows up as a second row.

use diesel_async::{AsyncConnection, RunQueryDsl};
use inbox_runtime::{InboxBackend, Outcome, idempotent};
use inbox_tests::{AppError, statement};

/// Creates `async_effects`; valid on PostgreSQL and MariaDB alike.
pub const EFFECTS_DDL: &str =
    "CREATE TABLE async_effects (message_id VARCHAR(255) NOT NULL, worker INTEGER NOT NULL)";

/// A delivered message and how its handler body should behave.
#[derive(Debug, Clone)]
pub struct Msg {
    pub id: String,
    pub worker: i32,
    pub fail: bool,
    pub panic: bool,
}

impl Msg {
    pub fn new(id: impl Into<String>) -> Self {
        Msg {
            id: id.into(),
            worker: 0,
            fail: false,
            panic: false,
        }
    }

    pub fn by(mut self, worker: i32) -> Self {
        self.worker = worker;
        self
    }

    pub fn failing(mut self) -> Self {
        self.fail = true;
        self
    }

    pub fn panicking(mut self) -> Self {
        self.panic = true;
        self
    }
}

/// Records one effect row, then behaves as the message asks: on an
/// `AsyncPgConnection` through [`record_pg`], the handler written for that
/// type (whose `BEGIN` travels with its claim, as for users who name the
/// type), on any other through [`record_generic`]. So the suite's
/// PostgreSQL tests take the pipelined path, and MariaDB's (and the pooled
/// handlers' below) the sequential one.
pub async fn record<C>(conn: &mut C, msg: &Msg) -> Result<Outcome<i32>, AppError>
where
    C: AsyncConnection<Backend: InboxBackend> + 'static,
{
    #[cfg(feature = "postgres")]
    if let Some(conn) = (conn as &mut dyn std::any::Any).downcast_mut() {
        return record_pg(conn, msg).await;
    }
    record_generic(conn, msg).await
}

/// [`record`]'s handler for any connection type.
#[idempotent(id = msg.id, handler = "async.record", shared_scope)]
pub async fn record_generic<C>(conn: &mut C, msg: &Msg) -> Result<Outcome<i32>, AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    record_body(conn, msg).await
}

/// [`record`]'s handler for `AsyncPgConnection` itself.
#[cfg(feature = "postgres")]
#[idempotent(id = msg.id, handler = "async.record", shared_scope)]
pub async fn record_pg(
    conn: &mut diesel_async::AsyncPgConnection,
    msg: &Msg,
) -> Result<Outcome<i32>, AppError> {
    record_body(conn, msg).await
}

async fn record_body<C>(conn: &mut C, msg: &Msg) -> Result<Outcome<i32>, AppError>
where
    C: AsyncConnection,
{
    write_effect(conn, &msg.id, msg.worker).await?;
    tokio::task::yield_now().await;
    if msg.fail {
        return Err(AppError::Failed("the body failed"));
    }
    if msg.panic {
        panic!("deliberate panic in the body");
    }
    Ok(Outcome::Processed(msg.worker))
}

/// A second handler of the same messages, in its own scope, with Diesel's
/// error type.
#[idempotent(id = msg.id, handler = "async.audit")]
pub async fn audit<C>(conn: &mut C, msg: &Msg) -> Result<(), diesel::result::Error>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    write_effect(conn, &msg.id, -1).await
}

/// The same handler on a pooled connection (a deadpool `Object`).
#[idempotent(id = msg.id, handler = "async.record", shared_scope)]
pub async fn record_deadpool<P>(conn: &mut P, msg: &Msg) -> Result<Outcome<()>, AppError>
where
    P: AsyncConnection<Backend: InboxBackend>,
{
    write_effect(conn, &msg.id, msg.worker).await?;
    Ok(Outcome::Processed(()))
}

/// The same handler on a pooled connection taken by value (a bb8
/// `PooledConnection`).
#[idempotent(id = msg.id, handler = "async.record", shared_scope)]
pub async fn record_bb8<P>(conn: P, msg: &Msg) -> Result<(), AppError>
where
    P: AsyncConnection<Backend: InboxBackend>,
{
    write_effect(conn, &msg.id, msg.worker).await?;
    Ok(())
}

/// Opens a diesel-async transaction inside the body and, when asked, panics
/// inside it: diesel-async's `transaction` has no unwind guard, so its
/// savepoint is still open when the panic reaches the handler.
#[idempotent(id = msg.id, handler = "async.nested_transaction")]
pub async fn nested_transaction<C>(conn: &mut C, msg: &Msg) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    write_effect(conn, &msg.id, 1).await?;
    conn.transaction(async |conn| {
        write_effect(conn, &msg.id, 2).await?;
        if msg.panic {
            panic!("deliberate panic inside a nested transaction");
        }
        Ok::<_, AppError>(())
    })
    .await
}

/// Ignores a failed statement, then reports success.
#[idempotent(id = msg.id, handler = "async.swallow")]
pub async fn swallows_a_failure<C>(conn: &mut C, msg: &Msg) -> Result<Outcome<()>, AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    write_effect(conn, &msg.id, 1).await?;
    let _ = statement("SELECT no_such_column FROM no_such_table")
        .execute(conn)
        .await;
    let _ = write_effect(conn, &msg.id, 2).await;
    Ok(Outcome::Processed(()))
}

/// A delivery whose body has its own connection killed by `killer`, then
/// panics: the rollback after the panic fails too.
pub struct Doomed<C> {
    pub id: String,
    /// The statement that ends the handler's connection.
    pub kill_sql: String,
    pub killer: tokio::sync::Mutex<C>,
}

#[idempotent(id = msg.id, handler = "async.killed_then_panics")]
pub async fn killed_then_panics<C>(conn: &mut C, msg: &Doomed<C>) -> Result<(), AppError>
where
    C: AsyncConnection<Backend: InboxBackend>,
{
    write_effect(conn, &msg.id, 1).await?;
    statement(&msg.kill_sql)
        .execute(&mut *msg.killer.lock().await)
        .await?;
    panic!("deliberate panic after the connection was killed");
}

/// One effect row. The message ids of these tests are plain words: they go
/// into the SQL as literals, which every backend reads the same way.
pub async fn write_effect<C>(conn: &mut C, message_id: &str, worker: i32) -> diesel::QueryResult<()>
where
    C: AsyncConnection,
{
    statement(format!(
        "INSERT INTO async_effects (message_id, worker) VALUES ({}, {worker})",
        literal(message_id)
    ))
    .execute(conn)
    .await
    .map(drop)
}

/// `text` as an SQL string literal.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}
