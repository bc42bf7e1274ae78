//! Recording an outgoing message in the caller's transaction, written once
//! over the delivery core's [`Executor`] for blocking and async
//! connections.

use diesel::connection::LoadConnection;

use super::OutgoingMessage;
use super::continuing;
use super::headers;
use super::id::OutboxId;
use crate::backend::{Bind, InboxBackend, KeyedInsert};
use crate::delivery::blocking::Blocking;
use crate::delivery::deferred;
use crate::delivery::executor::Executor;
use crate::error::InboxError;
use crate::execution::{block_ready, depth};

/// What [`InboxError::OutsideTransaction`] names.
const RECORDING: &str = "recording an outgoing message";

/// The most bytes of payload and headers sent with the handler's commit: a
/// larger message, whose transfer outweighs a round trip, is inserted at
/// once with its bytes bound rather than written out in hex.
const DEFERRED_MESSAGE_BYTES: usize = 16 * 1024;

/// Records `message` on `exec`'s connection, inside the transaction open
/// there: its id. Inside an `#[idempotent]` handler's own transaction, an
/// unkeyed message (of up to 16 KiB with its headers) is written by a
/// statement sent with the handler's commit, in its round trip
/// ([`deferred`]), where the backend and the connection send the commit as
/// one text (PostgreSQL; MySQL/MariaDB on diesel-async); anywhere else,
/// and for a keyed message (whose number in its key must follow the order
/// the body wrote them in, also across savepoints), at once.
pub(crate) async fn record<X: Executor>(
    exec: &mut X,
    message: &OutgoingMessage,
) -> Result<OutboxId, InboxError> {
    message.check()?;
    if depth(exec.status())? == 0 {
        return Err(InboxError::OutsideTransaction {
            operation: RECORDING,
        });
    }
    let id = OutboxId::generate();
    let trace = match message.trace() {
        Some(trace) => Some(trace.clone()),
        // A message that names no trace continues the running body's
        // (`continuing`), unless it carries a `traceparent` of its own.
        None if !has_traceparent(message) => continuing::current(),
        None => None,
    };
    let headers = match trace {
        None => headers::encode(message.headers()),
        Some(trace) => {
            let mut all = message.headers().to_vec();
            all.push(("traceparent".to_owned(), trace.child_of(&id)));
            headers::encode(&all)
        }
    };
    if message.key().is_none() && message.payload().len() + headers.len() <= DEFERRED_MESSAGE_BYTES
    {
        let deferred = deferred::defer(exec, || {
            <X::Backend as InboxBackend>::outbox_insert_text(
                id.as_str(),
                message.destination(),
                &headers,
                message.payload(),
            )
        });
        if deferred {
            return Ok(id);
        }
    }
    let mut binds = vec![
        Bind::Text(id.as_str()),
        Bind::Text(message.destination()),
        Bind::Bytes(&headers),
        Bind::Bytes(message.payload()),
    ];
    let sql = &<X::Backend as InboxBackend>::OUTBOX_SQL;
    match message.key() {
        None => {
            exec.execute_bound(sql.insert, &binds).await?;
        }
        Some(key) => {
            binds.push(Bind::Text(key));
            match sql.insert_keyed {
                KeyedInsert::OneStatement(insert) => {
                    exec.execute_bound(insert, &binds).await?;
                }
                KeyedInsert::AdvanceThenInsert { advance, insert } => {
                    exec.execute_bound(advance, &[Bind::Text(key)]).await?;
                    exec.execute_bound(insert, &binds).await?;
                }
            }
        }
    }
    Ok(id)
}

/// Whether `message` carries a `traceparent` header its caller added.
fn has_traceparent(message: &OutgoingMessage) -> bool {
    message
        .headers()
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("traceparent"))
}

/// Records `message` in the transaction open on `conn`, to be published by
/// a [`Relay`](super::Relay) once that transaction commits: its id, which
/// the relay sends as the broker's message id. If the transaction rolls
/// back, the message is gone with it, never published.
///
/// Inside an `#[idempotent]` handler, pass the handler's connection: the
/// message commits with the claim and the body's writes, so a redelivery
/// (a duplicate) records nothing and a failed attempt leaves nothing. It
/// works the same in any Diesel transaction without the inbox (an HTTP
/// handler writing an order and its event).
///
/// Errors: [`InboxError::OutsideTransaction`] when `conn` has no
/// transaction open (nothing is written: a message recorded in autocommit
/// would announce writes that may never commit);
/// [`InboxError::InvalidOutgoingMessage`] for a message the outbox cannot
/// store or a broker cannot carry; [`InboxError::Database`] if the insert
/// fails (the transaction should then roll back).
///
/// Inside an `#[idempotent]` handler's own transaction, an unkeyed message
/// of up to 16 KiB (headers included) is inserted by a statement sent with
/// the handler's commit, in its round trip, where the commit is one text
/// (PostgreSQL; MySQL/MariaDB on diesel-async): an insert the server
/// refuses then fails the delivery's commit, and nothing of the delivery
/// commits. Elsewhere (a keyed or larger message, a savepoint the body
/// opened, any other transaction) it is inserted at once.
///
/// Messages with the same [ordering key](OutgoingMessage::ordering_key)
/// are numbered in commit order: the key's counter row stays locked until
/// the transaction ends, so two transactions writing the same key take
/// turns, and a key written by many concurrent transactions serializes
/// them (keep keys fine-grained: an account, an order).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::outbox::{self, OutgoingMessage};
/// use inbox_runtime::InboxError;
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
///
/// let id = conn.transaction(|conn| {
///     // … the handler's own writes …
///     outbox::send(conn, &OutgoingMessage::new("receipts", "payment p-1 applied"))
/// })?;
/// assert_eq!(outbox::backlog(&mut conn)?.pending, 1);
///
/// // Outside a transaction: refused, nothing written.
/// let refused = outbox::send(&mut conn, &OutgoingMessage::new("receipts", "x"));
/// assert!(matches!(refused, Err(InboxError::OutsideTransaction { .. })));
/// assert_eq!(outbox::backlog(&mut conn)?.pending, 1);
/// # let _ = id;
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn send<C>(conn: &mut C, message: &OutgoingMessage) -> Result<OutboxId, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    block_ready(record(&mut Blocking::new(conn), message))
}

/// [`send`] on a diesel-async connection (feature `async`), inside the
/// transaction open on it (an async `#[idempotent]` handler's).
///
/// ```no_run
/// # #[cfg(feature = "async-postgres")]
/// # async fn example(conn: &mut diesel_async::AsyncPgConnection) -> Result<(), inbox_runtime::InboxError> {
/// use diesel_async::AsyncConnection;
/// use inbox_runtime::outbox::{self, OutgoingMessage};
///
/// conn.transaction(async |conn| {
///     outbox::send_async(conn, &OutgoingMessage::new("receipts", "p-1")).await?;
///     Ok::<_, inbox_runtime::InboxError>(())
/// })
/// .await
/// # }
/// ```
#[cfg(feature = "async")]
pub async fn send_async<C>(conn: &mut C, message: &OutgoingMessage) -> Result<OutboxId, InboxError>
where
    C: diesel_async::AsyncConnection,
    C::Backend: InboxBackend,
{
    record(
        &mut crate::delivery::asynchronous::Async::new(conn),
        message,
    )
    .await
}
