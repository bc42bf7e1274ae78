// Built as a binary of the `ui` suite's package, whose `missing_docs`
// lint is not what this case checks.
#![allow(missing_docs)]
#![deny(warnings)]

//! deadpool's `Object<_>` taken by value is detected as the connection, by
//! the diesel-async alias and by deadpool's own path, without `conn = ...`.

use diesel::prelude::*;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_runtime::idempotent;

/// A message.
pub struct Payment {
    /// Its id.
    pub id: uuid::Uuid,
}

#[idempotent(id = msg.id, handler = "async.object_by_value")]
async fn by_value(conn: Object<AsyncPgConnection>, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn).await?;
    Ok(())
}

#[idempotent(id = msg.id, handler = "async.object_mut_by_value")]
async fn mut_by_value(mut conn: Object<AsyncPgConnection>, msg: &Payment) -> QueryResult<()> {
    diesel::sql_query("SELECT 1").execute(conn).await?;
    Ok(())
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

#[allow(dead_code)]
async fn consume(pool: Pool<AsyncPgConnection>, msg: Payment) -> QueryResult<()> {
    assert_send(by_value(pool.get().await.expect("a connection"), &msg)).await?;
    assert_send(mut_by_value(pool.get().await.expect("a connection"), &msg)).await
}

fn main() {}
