// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
#![deny(warnings)]

//! Async handlers on diesel-async: direct, generic, pooled (deadpool by
//! reference, bb8 by value), methods, `Outcome`, early return and `?`; and
//! their futures are `Send`, so they can be spawned on a multi-threaded
//! runtime.

use diesel::prelude::*;
use diesel_async::pooled_connection::{bb8, deadpool};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use inbox_runtime::{InboxBackend, Outcome, idempotent};

/// A message.
pub struct Payment {
    /// Its id.
    pub id: uuid::Uuid,
    /// Its amount.
    pub cents: i64,
}

#[idempotent(id = msg.id, handler = "async.direct")]
async fn direct(conn: &mut AsyncPgConnection, msg: &Payment) -> QueryResult<()> {
    if msg.cents == 0 {
        return Ok(());
    }
    diesel::sql_query("SELECT 1").execute(conn).await?;
    Ok(())
}

#[idempotent(id = msg.id, handler = "async.limited", max_attempts = 3)]
async fn limited(conn: &mut AsyncPgConnection, msg: &Payment) -> QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = msg.id, handler = "async.unbounded", max_attempts = unbounded)]
async fn unbounded(conn: &mut AsyncPgConnection, msg: &Payment) -> QueryResult<()> {
    let _ = (conn, msg);
    Ok(())
}

#[idempotent(id = msg.id, handler = "async.generic")]
async fn generic<C>(conn: &mut C, msg: &Payment) -> QueryResult<Outcome<i64>>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
{
    let _ = conn;
    Ok(Outcome::Processed(msg.cents))
}

#[idempotent(id = msg.id, handler = "async.deadpool")]
async fn pooled(conn: &mut deadpool::Object<AsyncPgConnection>, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn).await?;
    Ok(())
}

#[idempotent(id = msg.id, handler = "async.bb8")]
async fn pooled_by_value(
    conn: bb8::PooledConnection<'_, AsyncPgConnection>,
    msg: &Payment,
) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn).await?;
    Ok(())
}

/// A consumer with state.
pub struct Consumer {
    /// Counted per processed message.
    pub label: &'static str,
}

impl Consumer {
    #[idempotent(id = msg.id, handler = "async.method")]
    async fn handle(
        &self,
        conn: &mut AsyncPgConnection,
        msg: &Payment,
    ) -> QueryResult<Outcome<&'static str>> {
        diesel::sql_query("SELECT 1").execute(conn).await?;
        Ok(Outcome::Processed(self.label))
    }
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

/// The futures are `Send`: each can be handed to `tokio::spawn`.
#[allow(dead_code)]
async fn spawnable(pool: deadpool::Pool<AsyncPgConnection>, msg: Payment) -> QueryResult<()> {
    let task = tokio::spawn(assert_send(async move {
        let mut conn = pool.get().await.expect("a connection");
        direct(&mut conn, &msg).await?;
        limited(&mut conn, &msg).await?;
        unbounded(&mut conn, &msg).await?;
        let _cents = generic(&mut *conn, &msg).await?.processed();
        pooled(&mut conn, &msg).await?;
        let _label = Consumer { label: "c" }
            .handle(&mut conn, &msg)
            .await?
            .processed();
        QueryResult::Ok(())
    }));
    task.await.expect("the task finished")
}

#[idempotent(id = msg.id, handler = "async.bb8_ref")]
async fn bb8_by_ref(
    conn: &mut bb8::PooledConnection<'_, AsyncPgConnection>,
    msg: &Payment,
) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn).await?;
    Ok(())
}

#[allow(dead_code)]
async fn by_value(pool: bb8::Pool<AsyncPgConnection>, msg: Payment) -> QueryResult<()> {
    assert_send(pooled_by_value(
        pool.get().await.expect("a connection"),
        &msg,
    ))
    .await?;
    assert_send(bb8_by_ref(
        &mut pool.get().await.expect("a connection"),
        &msg,
    ))
    .await
}

/// The runtime's own async entry points are `Send` too, a failing body
/// included (its future holds the failure's record across awaits): the
/// closure form, a batch, and the claimed transaction written out.
#[allow(dead_code)]
async fn entry_points(pool: deadpool::Pool<AsyncPgConnection>) -> QueryResult<()> {
    use inbox_runtime::{ClaimKey, HandlerName, InboxError, MaxAttempts};
    let task = tokio::spawn(assert_send(async move {
        let mut conn = pool.get().await.expect("a connection");
        let handler = HandlerName::new("async.entry_points").expect("a valid name");
        let key = ClaimKey::new(handler.clone(), "m-1").expect("a valid id");
        let failed = inbox_runtime::run_idempotent_async_with(
            &mut *conn,
            key.clone(),
            MaxAttempts::limit(3),
            async |_conn| Err::<(), _>(InboxError::rejected("no")),
        )
        .await;
        let _ = failed;
        let messages = [String::from("a"), String::from("b")];
        let report = inbox_runtime::run_idempotent_batch_async(
            &mut *conn,
            &handler,
            &messages,
            |id| id.as_str(),
            async move |conn, _id| diesel::sql_query("SELECT 1").execute(conn).await.map(drop),
        )
        .await;
        let _ = report.processed();
        if let Some(mut claimed) = inbox_runtime::begin_claimed(&mut *conn, &key).await? {
            let effect = diesel::sql_query("SELECT 1")
                .execute(claimed.conn())
                .await
                .map(drop);
            claimed.finish(effect).await?;
        }
        QueryResult::Ok(())
    }));
    task.await.expect("the task finished")
}

fn main() {}
