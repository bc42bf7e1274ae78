//! The outbox's operator surface: its backlog, and the messages the broker
//! refused until they were dead.

use diesel::connection::LoadConnection;

use super::id::OutboxId;
use crate::backend::{BacklogRow, Bind, DeadOutboxRow, InboxBackend};
use crate::error::InboxError;

/// What is waiting in the outbox (see [`backlog`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backlog {
    /// Messages committed and not yet confirmed by the broker (dead ones
    /// excluded).
    pub pending: u64,
    /// Dead messages (see [`dead`]).
    pub dead: u64,
    /// When the oldest pending message was recorded: microseconds since the
    /// Unix epoch, by the database clock; `None` when nothing is pending.
    pub oldest_pending_micros: Option<i64>,
}

/// The outbox's backlog: one query over the unsent messages (an index
/// range).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let backlog = inbox_runtime::outbox::backlog(&mut conn)?;
/// assert_eq!((backlog.pending, backlog.dead, backlog.oldest_pending_micros), (0, 0, None));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn backlog<C>(conn: &mut C) -> Result<Backlog, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let rows: Vec<BacklogRow> = C::Backend::load_outbox_backlog(conn)?;
    let row = rows.into_iter().next();
    Ok(Backlog {
        pending: row.as_ref().map_or(0, |row| row.pending.max(0) as u64),
        dead: row.as_ref().map_or(0, |row| row.dead.max(0) as u64),
        oldest_pending_micros: row.and_then(|row| row.oldest_micros),
    })
}

/// A message the broker refused [`Relay::max_attempts`](super::Relay::max_attempts)
/// times: not published, and holding back the later messages of its
/// ordering key until it is [revived](revive) or [discarded](discard).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadMessage {
    /// Its place in the outbox (pages of [`dead`] continue after it).
    pub position: i64,
    /// Its id.
    pub id: OutboxId,
    /// Its destination.
    pub destination: String,
    /// Its ordering key, if any.
    pub ordering_key: Option<String>,
    /// Refused publishes.
    pub attempts: u32,
    /// What the broker said the last time.
    pub last_error: String,
    /// When it was recorded (microseconds since the Unix epoch).
    pub created_micros: i64,
    /// When it died (microseconds since the Unix epoch).
    pub dead_micros: i64,
}

/// One page of dead messages, oldest first: at most `limit` (1 to 1000)
/// after position `after` (0 for the first page; then the last one's
/// [`position`](DeadMessage::position)).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// assert!(inbox_runtime::outbox::dead(&mut conn, 0, 100)?.is_empty());
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn dead<C>(conn: &mut C, after: i64, limit: u32) -> Result<Vec<DeadMessage>, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    if !(1..=1000).contains(&limit) {
        return Err(InboxError::InvalidBatchSize {
            requested: limit,
            max: 1000,
        });
    }
    let rows: Vec<DeadOutboxRow> =
        C::Backend::load_dead_outbox(conn, &[Bind::BigInt(after), Bind::BigInt(i64::from(limit))])?;
    Ok(rows
        .into_iter()
        .map(|row| DeadMessage {
            position: row.position,
            id: OutboxId::from_stored(row.id),
            destination: row.destination,
            ordering_key: row.ordering_key,
            attempts: u32::try_from(row.attempts).unwrap_or(0),
            last_error: row.last_error.unwrap_or_default(),
            created_micros: row.created_micros,
            dead_micros: row.dead_micros,
        })
        .collect())
}

/// Makes dead messages pending again, their attempts reset: the one with
/// `id`, or every dead message with `None` (after the broker was fixed: the
/// queue bound, the stream created). The relay publishes them in their
/// keys' order. The number revived.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// assert_eq!(inbox_runtime::outbox::revive(&mut conn, None)?, 0);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn revive<C>(conn: &mut C, id: Option<&OutboxId>) -> Result<u64, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let sql = <C::Backend as InboxBackend>::OUTBOX_SQL.revive;
    by_id(conn, sql, id)
}

/// Deletes dead messages for good: the one with `id`, or every dead
/// message with `None`. Their keys' later messages are published next. The
/// number discarded.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// assert_eq!(inbox_runtime::outbox::discard(&mut conn, None)?, 0);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn discard<C>(conn: &mut C, id: Option<&OutboxId>) -> Result<u64, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let sql = <C::Backend as InboxBackend>::OUTBOX_SQL.discard;
    by_id(conn, sql, id)
}

fn by_id<C>(conn: &mut C, sql: &str, id: Option<&OutboxId>) -> Result<u64, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let id = id.map(OutboxId::as_str);
    let rows =
        C::Backend::execute_bound(conn, sql, &[Bind::OptionalText(id), Bind::OptionalText(id)])?;
    Ok(rows as u64)
}
