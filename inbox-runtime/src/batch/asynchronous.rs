//! The batch form on diesel-async connections.

use diesel_async::AsyncConnection;

use super::attempt::Batch;
use super::bodies::{Bulk, Each};
use super::{BatchReport, Run};
use crate::backend::InboxBackend;
use crate::delivery::asynchronous::Async;
use crate::error::HandlerError;
use crate::key::HandlerName;
use crate::message_id::MessageId;
use crate::options::Options;

/// [`run_idempotent_batch`](crate::run_idempotent_batch) on a diesel-async
/// connection, with the same guarantees, and those of
/// [`run_idempotent_async`](crate::run_idempotent_async) for a cancelled
/// future: dropped while a transaction of the batch is open, it leaves the
/// connection's transaction manager broken (a pool discards it) and the
/// server rolls that transaction back when the connection closes, or when it
/// sat idle for [`abandoned_transaction_timeout`](crate::abandoned_transaction_timeout).
///
/// The future is `Send` when the connection, the messages and the body's
/// futures are, so it can be spawned. A body that borrows what it captures
/// (`async |conn, msg| apply(conn, &account, msg).await`) may fail
/// `tokio::spawn`'s check with "implementation of `Send` is not general
/// enough", a limit of the compiler's reasoning about borrowed captures:
/// move the captures in (`async move |conn, msg| …`, cloning what the body
/// needs).
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{ack_decision, run_idempotent_batch_async, HandlerName};
///
/// let handler = HandlerName::new("greeter")?;
/// let ids = ["m-1", "m-2", "m-3"];
/// let report = run_idempotent_batch_async(conn, &handler, &ids, |id| *id, async |_conn, id| {
///     Ok::<usize, inbox_runtime::InboxError>(id.len())
/// })
/// .await;
/// for result in report.results() {
///     let _decision = ack_decision(result);
/// }
/// # Ok(())
/// # }
/// ```
pub async fn run_idempotent_batch_async<C, M, I, T, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    body: F,
) -> BatchReport<T, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: AsyncFnMut(&mut C, &M) -> Result<T, E>,
{
    let options = Options::new();
    run_idempotent_batch_async_with(conn, handler, messages, id_of, options, body).await
}

/// [`run_idempotent_batch_async`] with the handler's own [`Options`]
/// instead of the process defaults.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{run_idempotent_batch_async_with, HandlerName, MaxAttempts};
///
/// let handler = HandlerName::new("greeter")?;
/// let report = run_idempotent_batch_async_with(conn, &handler, &["m-1"], |id| *id, MaxAttempts::limit(3), async |_conn, _id| {
///     Ok::<(), inbox_runtime::InboxError>(())
/// })
/// .await;
/// assert_eq!(report.len(), 1);
/// # Ok(())
/// # }
/// ```
pub async fn run_idempotent_batch_async_with<C, M, I, T, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    options: impl Into<Options>,
    body: F,
) -> BatchReport<T, E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: AsyncFnMut(&mut C, &M) -> Result<T, E>,
{
    let mut batch = Batch {
        exec: Async::new(conn),
        bodies: Each(body),
        options: options.into(),
    };
    Run::drive(&mut batch, handler, messages, id_of).await
}

/// [`run_idempotent_batch_bulk`](crate::run_idempotent_batch_bulk) on a
/// diesel-async connection: one `async` body for all the new messages of a
/// transaction, with the guarantees of [`run_idempotent_batch_async`].
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{run_idempotent_batch_bulk_async, HandlerName};
///
/// let handler = HandlerName::new("ledger.record")?;
/// let report = run_idempotent_batch_bulk_async(conn, &handler, &["m-1", "m-2"], |id| *id, async |_conn, ids: &[&&str]| {
///     // One statement writing the effects of every id in `ids`.
///     Ok::<(), inbox_runtime::InboxError>(())
/// })
/// .await;
/// assert_eq!(report.len(), 2);
/// # Ok(())
/// # }
/// ```
pub async fn run_idempotent_batch_bulk_async<C, M, I, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    body: F,
) -> BatchReport<(), E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: AsyncFnMut(&mut C, &[&M]) -> Result<(), E>,
{
    let options = Options::new();
    run_idempotent_batch_bulk_async_with(conn, handler, messages, id_of, options, body).await
}

/// [`run_idempotent_batch_bulk_async`] with the handler's own [`Options`]
/// instead of the process defaults.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn demo(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::{run_idempotent_batch_bulk_async_with, HandlerName, MaxAttempts};
///
/// let handler = HandlerName::new("ledger.record")?;
/// let report = run_idempotent_batch_bulk_async_with(conn, &handler, &["m-1"], |id| *id, MaxAttempts::limit(3), async |_conn, _ids: &[&&str]| {
///     Ok::<(), inbox_runtime::InboxError>(())
/// })
/// .await;
/// assert_eq!(report.len(), 1);
/// # Ok(())
/// # }
/// ```
pub async fn run_idempotent_batch_bulk_async_with<C, M, I, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    options: impl Into<Options>,
    body: F,
) -> BatchReport<(), E>
where
    C: AsyncConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: AsyncFnMut(&mut C, &[&M]) -> Result<(), E>,
{
    let mut batch = Batch {
        exec: Async::new(conn),
        bodies: Bulk(body),
        options: options.into(),
    };
    Run::drive(&mut batch, handler, messages, id_of).await
}
