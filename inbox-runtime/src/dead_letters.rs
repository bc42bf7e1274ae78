//! The operator's view of dead messages: list them, revive them, purge them.
//!
//! A message is dead when its handler rejected it
//! ([`InboxError::rejected`]) or when it failed as many times as the
//! handler's [`MaxAttempts`](crate::MaxAttempts) allows. Its id is then
//! claimed in `inbox_messages`, so every later delivery is skipped as a
//! duplicate, and `inbox_failures` keeps why: the attempt count, the last
//! error, when it failed first and last, when it died.
//!
//! - [`summary`]: how many dead messages each handler has.
//! - [`list`]: one handler's dead messages, oldest first, a page at a time.
//! - [`revive`] / [`revive_all`]: forget the claim and the failures, so the
//!   **next delivery** of the message runs the body again with a fresh
//!   attempt count (the inbox does not redeliver by itself: replay the
//!   message from the broker's dead-letter queue after reviving it).
//! - [`purge`] / [`purge_all`]: forget the failure records but keep the
//!   claims, so redeliveries stay skipped until retention prunes them.
//!
//! Each call is one transaction; pruning removes dead records, like claims,
//! once they are older than the retention window.
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel::prelude::*;
//! use inbox_runtime::{dead_letters, run_idempotent, ClaimKey, HandlerName, InboxError};
//!
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! inbox_runtime::setup(&mut conn)?;
//! let orders = HandlerName::new("orders.reserve")?;
//! let key = ClaimKey::new(orders.clone(), "order-9")?;
//! let rejected = run_idempotent(&mut conn, key, |_conn: &mut SqliteConnection| {
//!     Err::<(), InboxError>(InboxError::rejected("sku 17 does not exist"))
//! });
//! assert!(rejected.is_err());
//!
//! let page = dead_letters::list(&mut conn, &orders, None, 50)?;
//! assert_eq!(page.letters[0].message_id, "order-9");
//! assert!(page.letters[0].rejected);
//! assert_eq!(dead_letters::revive(&mut conn, &orders, ["order-9"])?, 1);
//! assert!(dead_letters::list(&mut conn, &orders, None, 50)?.letters.is_empty());
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::Connection;
use diesel::connection::LoadConnection;

use crate::backend::{Bind, DeadLetterRow, InboxBackend};
use crate::error::InboxError;
use crate::key::{ClaimKey, HandlerName};
use crate::message_id::MessageId;

/// The most dead messages one [`list`] call returns.
///
/// ```
/// assert_eq!(inbox_runtime::dead_letters::MAX_PAGE_SIZE, 1_000);
/// ```
pub const MAX_PAGE_SIZE: u32 = 1_000;

/// One dead message.
///
/// ```
/// # fn show(letter: &inbox_runtime::dead_letters::DeadLetter) {
/// println!("{} {} after {} attempts: {}", letter.handler, letter.message_id, letter.attempts, letter.last_error);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The handler (deduplication scope).
    pub handler: String,
    /// The message id.
    pub message_id: String,
    /// Failed attempts counted (a lower bound; a rejection counts one).
    pub attempts: u32,
    /// The last error, or the rejection's reason (at most
    /// [`MAX_ERROR_TEXT_BYTES`](crate::MAX_ERROR_TEXT_BYTES)).
    pub last_error: String,
    /// `true` when the handler rejected the message; `false` when its
    /// attempts were exhausted.
    pub rejected: bool,
    /// When the first counted attempt failed, by the database clock.
    pub first_failed_at: SystemTime,
    /// When the last counted attempt failed.
    pub last_failed_at: SystemTime,
    /// When the message was recorded as dead.
    pub dead_at: SystemTime,
}

/// One page of [`list`]: the dead messages, and where the next page starts
/// (`None` after the last).
///
/// ```
/// # fn all(conn: &mut diesel::SqliteConnection, handler: &inbox_runtime::HandlerName) -> Result<(), inbox_runtime::InboxError> {
/// use inbox_runtime::dead_letters;
/// let mut after = None;
/// loop {
///     let page = dead_letters::list(conn, handler, after.as_ref(), 100)?;
///     for letter in &page.letters { println!("{}", letter.message_id); }
///     match page.next { Some(next) => after = Some(next), None => break }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterPage {
    /// The dead messages, oldest first.
    pub letters: Vec<DeadLetter>,
    /// Pass to [`list`] for the next page.
    pub next: Option<Cursor>,
}

/// Where a page of [`list`] starts: after this dead message. Its text form
/// (`Display` / `FromStr`) lets a command-line tool print and take it.
///
/// ```
/// use inbox_runtime::dead_letters::Cursor;
/// let cursor: Cursor = "1764720000000000:order-9".parse()?;
/// assert_eq!(cursor.to_string(), "1764720000000000:order-9");
/// assert!("no-colon".parse::<Cursor>().is_err());
/// # Ok::<(), inbox_runtime::dead_letters::InvalidCursor>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cursor {
    dead_micros: i64,
    message_id: String,
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.dead_micros, self.message_id)
    }
}

/// A cursor's text that [`Cursor`] cannot read.
///
/// ```
/// assert!("x".parse::<inbox_runtime::dead_letters::Cursor>().unwrap_err().to_string().contains("cursor"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCursor;

impl fmt::Display for InvalidCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a dead-letter cursor (expected `<microseconds>:<message id>`)")
    }
}

impl std::error::Error for InvalidCursor {}

impl FromStr for Cursor {
    type Err = InvalidCursor;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (micros, message_id) = text.split_once(':').ok_or(InvalidCursor)?;
        Ok(Cursor {
            dead_micros: micros.parse().map_err(|_| InvalidCursor)?,
            message_id: message_id.to_owned(),
        })
    }
}

/// How many dead messages one handler has.
///
/// ```
/// # fn show(dead: &inbox_runtime::dead_letters::DeadHandler) {
/// println!("{}: {} dead", dead.handler, dead.dead);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadHandler {
    /// The handler.
    pub handler: String,
    /// Its dead messages.
    pub dead: u64,
    /// When the oldest of them died.
    pub oldest_dead_at: SystemTime,
}

/// Every handler with dead messages, by name.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// assert!(inbox_runtime::dead_letters::summary(&mut conn)?.is_empty());
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn summary<C>(conn: &mut C) -> Result<Vec<DeadHandler>, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let rows = C::Backend::load_dead_summary(conn)?;
    Ok(rows
        .into_iter()
        .map(|row| DeadHandler {
            handler: row.handler,
            dead: u64::try_from(row.dead).unwrap_or(0),
            oldest_dead_at: time_of(row.oldest_micros),
        })
        .collect())
}

/// One page of `handler`'s dead messages, oldest first: at most `limit`
/// (1 to [`MAX_PAGE_SIZE`]), starting after `after` (`None`: the first).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{dead_letters, HandlerName};
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let page = dead_letters::list(&mut conn, &HandlerName::new("orders")?, None, 20)?;
/// assert!(page.letters.is_empty() && page.next.is_none());
/// assert!(dead_letters::list(&mut conn, &HandlerName::new("orders")?, None, 0).is_err());
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn list<C>(
    conn: &mut C,
    handler: &HandlerName,
    after: Option<&Cursor>,
    limit: u32,
) -> Result<DeadLetterPage, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    if !(1..=MAX_PAGE_SIZE).contains(&limit) {
        return Err(InboxError::InvalidBatchSize {
            requested: limit,
            max: MAX_PAGE_SIZE,
        });
    }
    let (after_micros, after_id) = after.map_or((i64::MIN, ""), |cursor| {
        (cursor.dead_micros, cursor.message_id.as_str())
    });
    let rows = C::Backend::load_dead_letters(
        conn,
        &[
            Bind::Text(handler.as_str()),
            Bind::BigInt(after_micros),
            Bind::BigInt(after_micros),
            Bind::Text(after_id),
            Bind::BigInt(i64::from(limit)),
        ],
    )?;
    let next = (rows.len() == limit as usize)
        .then(|| rows.last())
        .flatten()
        .map(|last| Cursor {
            dead_micros: last.dead_micros,
            message_id: last.message_id.clone(),
        });
    Ok(DeadLetterPage {
        letters: rows.into_iter().map(letter_of).collect(),
        next,
    })
}

/// Revives `handler`'s dead messages with these ids, in one transaction:
/// their claims and failure records are deleted, so the next delivery of
/// each runs the body with a fresh attempt count. Ids that are not dead are
/// left alone (a processed message's claim is never touched). Returns how
/// many were revived.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{dead_letters, HandlerName};
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// assert_eq!(dead_letters::revive(&mut conn, &HandlerName::new("orders")?, ["o-1", "o-2"])?, 0);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn revive<C, I>(conn: &mut C, handler: &HandlerName, message_ids: I) -> Result<u64, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: IntoIterator,
    I::Item: MessageId,
{
    for_each_id(conn, handler, message_ids, revive_matching)
}

/// Revives every dead message of `handler` (see [`revive`]).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{dead_letters, HandlerName};
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// assert_eq!(dead_letters::revive_all(&mut conn, &HandlerName::new("orders")?)?, 0);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn revive_all<C>(conn: &mut C, handler: &HandlerName) -> Result<u64, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    conn.transaction(|conn| revive_matching(conn, handler, None))
}

/// Purges `handler`'s dead messages with these ids: their failure records
/// are deleted, their claims kept, so redeliveries stay skipped until
/// retention prunes the claims. Returns how many were purged.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{dead_letters, HandlerName};
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// assert_eq!(dead_letters::purge(&mut conn, &HandlerName::new("orders")?, ["o-1"])?, 0);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn purge<C, I>(conn: &mut C, handler: &HandlerName, message_ids: I) -> Result<u64, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: IntoIterator,
    I::Item: MessageId,
{
    for_each_id(conn, handler, message_ids, forget_dead)
}

/// Purges every dead message of `handler` (see [`purge`]).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{dead_letters, HandlerName};
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// assert_eq!(dead_letters::purge_all(&mut conn, &HandlerName::new("orders")?)?, 0);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn purge_all<C>(conn: &mut C, handler: &HandlerName) -> Result<u64, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    conn.transaction(|conn| forget_dead(conn, handler, None))
}

/// Runs `operation` for each of `handler`'s `message_ids` in one
/// transaction, and adds up what it affected. Every id is validated first:
/// nothing is changed when one is invalid.
fn for_each_id<C, I>(
    conn: &mut C,
    handler: &HandlerName,
    message_ids: I,
    operation: fn(&mut C, &HandlerName, Option<&str>) -> Result<u64, InboxError>,
) -> Result<u64, InboxError>
where
    C: Connection,
    I: IntoIterator,
    I::Item: MessageId,
{
    let keys = message_ids
        .into_iter()
        .map(|id| ClaimKey::new(handler.clone(), &id))
        .collect::<Result<Vec<_>, _>>()?;
    conn.transaction(|conn| {
        keys.iter()
            .map(|key| operation(conn, handler, Some(key.message_id())))
            .sum()
    })
}

/// Deletes the claims of the matching dead messages (also from archived
/// generations, where the layout has them), then their failure records.
fn revive_matching<C>(
    conn: &mut C,
    handler: &HandlerName,
    message_id: Option<&str>,
) -> Result<u64, InboxError>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let sql = &C::Backend::FAILURE_SQL;
    let claims = [
        Bind::Text(handler.as_str()),
        Bind::Text(handler.as_str()),
        Bind::OptionalText(message_id),
        Bind::OptionalText(message_id),
    ];
    C::Backend::execute_bound(conn, sql.revive_claims, &claims)?;
    if let Some((probe, archived)) = sql.archived_claims {
        if C::Backend::load_flag(conn, probe)? {
            C::Backend::execute_bound(conn, archived, &claims)?;
        }
    }
    forget_dead(conn, handler, message_id)
}

fn forget_dead<C>(
    conn: &mut C,
    handler: &HandlerName,
    message_id: Option<&str>,
) -> Result<u64, InboxError>
where
    C: Connection,
    C::Backend: InboxBackend,
{
    let forgotten = C::Backend::execute_bound(
        conn,
        C::Backend::FAILURE_SQL.forget_dead,
        &[
            Bind::Text(handler.as_str()),
            Bind::OptionalText(message_id),
            Bind::OptionalText(message_id),
        ],
    )?;
    Ok(forgotten as u64)
}

fn time_of(micros: i64) -> SystemTime {
    match u64::try_from(micros) {
        Ok(after) => UNIX_EPOCH + Duration::from_micros(after),
        Err(_) => UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs()),
    }
}

fn letter_of(row: DeadLetterRow) -> DeadLetter {
    DeadLetter {
        handler: row.handler,
        message_id: row.message_id,
        attempts: u32::try_from(row.attempts).unwrap_or(0),
        last_error: row.last_error,
        rejected: row.rejected,
        first_failed_at: time_of(row.first_failed_micros),
        last_failed_at: time_of(row.last_failed_micros),
        dead_at: time_of(row.dead_micros),
    }
}
