//! The outbox's statements as each backend writes them ([`OutboxSql`]), and
//! the rows they read.
//!
//! Times come from the database clock. Statements that take a list of
//! positions end with an open `IN (`: the caller appends the positions
//! (integers the relay read from the table) and the closing parenthesis,
//! after every bound value. (Bound as one array in a prepared statement
//! instead, PostgreSQL's delete made a relay round three times slower in
//! `benches/outbox.rs`, for a reason not found: the server's plans and
//! timings were the same.)

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Binary, Integer, Nullable, Text};

/// One backend's statements over `inbox_outbox` and `inbox_outbox_keys`.
/// Each takes its binds in the order given.
#[doc(hidden)]
#[derive(Debug)]
pub struct OutboxSql {
    /// Records a message without an ordering key: `(id, destination,
    /// headers, payload)`.
    pub(crate) insert: &'static str,
    /// Records a message with an ordering key, numbered after the key's
    /// last one.
    pub(crate) insert_keyed: KeyedInsert,
    /// Leases the next messages a relay may publish.
    pub(crate) lease: Lease,
    /// Leases the next messages by deleting them, where the backend can (a
    /// relay that does not [keep sent messages](crate::outbox::Relay::keep_sent)):
    /// see [`DeletingLease`].
    pub(crate) deleting_lease: Option<DeletingLease>,
    /// Marks messages sent, kept for their retention (positions appended): a
    /// relay that [keeps sent messages](crate::outbox::Relay::keep_sent).
    pub(crate) mark_sent: &'static str,
    /// Deletes messages the broker confirmed (positions appended): what a relay
    /// does with them by default.
    pub(crate) delete_sent: &'static str,
    /// Gives leased messages back unpublished: `(owner)`, positions
    /// appended.
    pub(crate) release: &'static str,
    /// Counts a refused publish and sets the next try, or marks the message
    /// dead at the limit: `(limit, backoff_millis, last_error, position,
    /// owner)` (a backend whose round holds its rows locked,
    /// [`Lease::HeldLock`], need not check the owner).
    pub(crate) record_refusal: &'static str,
    /// One page of dead messages, oldest position first: `(after_position,
    /// limit)`.
    pub(crate) list_dead: &'static str,
    /// Makes dead messages pending again, attempts reset: `(id or NULL, id
    /// or NULL)`.
    pub(crate) revive: &'static str,
    /// Deletes dead messages: `(id or NULL, id or NULL)`.
    pub(crate) discard: &'static str,
    /// The backlog: `pending` (unsent, not dead), `dead`, and
    /// `oldest_micros` (the oldest pending message's `created_at`, or NULL).
    pub(crate) backlog: &'static str,
}

/// How a backend records a message with an ordering key. Both take the
/// binds `(id, destination, headers, payload, ordering_key)`.
#[doc(hidden)]
#[derive(Debug)]
// A build with one backend constructs that backend's shape only.
#[allow(dead_code)]
pub enum KeyedInsert {
    /// One statement advances the key's counter and inserts the message.
    OneStatement(&'static str),
    /// `advance` (binds `(ordering_key)`) locks and advances the key's
    /// counter, then `insert` numbers the message after it.
    AdvanceThenInsert {
        /// Upserts the key's counter: `(ordering_key)`.
        advance: &'static str,
        /// Inserts the message with the counter's value.
        insert: &'static str,
    },
}

/// How a backend leases the next messages to publish: the oldest pending
/// messages (by position) that no other relay holds, that are not waiting
/// for a retry, and that are the first unsent message of their ordering key.
/// Both return [`OutboxRow`]s.
#[doc(hidden)]
#[derive(Debug)]
// A build with one backend constructs that backend's shape only.
#[allow(dead_code)]
pub enum Lease {
    /// One statement picks, leases and returns them: `(owner,
    /// lease_millis, limit)`.
    Returning(&'static str),
    /// In one transaction: `select` picks and locks them, skipping rows
    /// another relay has locked (`(limit)`), then `lease` (`(owner,
    /// lease_millis)`, positions appended) leases them.
    LockThenWrite {
        /// The locking select.
        select: &'static str,
        /// The lease update.
        lease: &'static str,
    },
    /// One statement picks and locks them, skipping rows another relay has
    /// locked, in a transaction the round holds open while it publishes
    /// and ends after recording what the broker answered: the row locks
    /// are the lease, written nowhere, released the moment the relay's
    /// connection ends, and the statement bounds how long the transaction
    /// may sit idle (`(lease_millis as text, limit)`).
    HeldLock(&'static str),
}

/// A lease that deletes the messages it picks and returns them, in a
/// transaction the round holds open while it publishes: a message the
/// broker confirmed costs no statement after the broker's answer, and the
/// round's commit is its record. What the broker did not confirm is put
/// back: the whole round rolled back when it recorded nothing (no message
/// confirmed, none refused), the messages inserted again as they were
/// (`restore`) otherwise, in the round's transaction, so that once the
/// round commits, a message the broker confirmed is gone for every relay.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct DeletingLease {
    /// Picks, locks (skipping rows another relay has locked), deletes and
    /// returns the messages, bounding how long the transaction may sit idle:
    /// `(lease_millis as text, limit)`. It also marks the transaction as a
    /// relay's, whose inserts are put-backs: they notify no relay that
    /// wakes on commit.
    pub(crate) lease: &'static str,
    /// Inserts `rows` messages again as the lease returned them, in one
    /// statement: [`RESTORE_BINDS`] binds per message, one message after
    /// the other, `(position, id, destination, ordering_key, key_seq,
    /// headers, payload, created_micros, attempts, last_error,
    /// retry_micros)`.
    pub(crate) restore: fn(rows: usize) -> String,
}

/// The binds of one message a [`DeletingLease`] puts back.
#[cfg(feature = "postgres")]
pub(crate) const RESTORE_BINDS: usize = 11;

/// An outgoing message's unkeyed insert with its values written into the
/// text ([`InboxBackend::outbox_insert_text`](crate::backend::InboxBackend::outbox_insert_text)):
/// each backend gives how it writes a text value and a bytes value as
/// literals that no session setting reads otherwise.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn insert_text(
    [id, destination]: [&str; 2],
    [headers, payload]: [&[u8]; 2],
    text: impl Fn(&mut String, &str),
    bytes: impl Fn(&mut String, &[u8]),
) -> String {
    let mut sql = String::with_capacity(
        128 + 2 * (id.len() + destination.len() + headers.len() + payload.len()),
    );
    sql.push_str("INSERT INTO inbox_outbox (id, destination, headers, payload) VALUES (");
    text(&mut sql, id);
    sql.push_str(", ");
    text(&mut sql, destination);
    sql.push_str(", ");
    bytes(&mut sql, headers);
    sql.push_str(", ");
    bytes(&mut sql, payload);
    sql.push(')');
    sql
}

/// `bytes` as hex digits (two a byte, uppercase), for the literals of
/// [`insert_text`] and MySQL's claim text.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn push_hex_digits(sql: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    sql.reserve(2 * bytes.len());
    for byte in bytes {
        sql.push(char::from(DIGITS[usize::from(byte >> 4)]));
        sql.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
}

/// The condition a message meets to be leased (the table is `o`), with the
/// backend's current time: pending, no lease held, no retry waited for, and
/// no earlier unsent message of its ordering key (a dead one included, so a
/// dead message holds back the rest of its key until it is revived or
/// discarded).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! outbox_leasable {
    ($now:literal) => {
        concat!(
            "o.sent_at IS NULL AND o.dead_at IS NULL AND (o.retry_at IS NULL OR o.retry_at <= ",
            $now,
            ") AND (o.leased_until IS NULL OR o.leased_until <= ",
            $now,
            ") AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM inbox_outbox p \
             WHERE p.ordering_key = o.ordering_key AND p.sent_at IS NULL AND p.key_seq < o.key_seq))"
        )
    };
}
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) use outbox_leasable;

/// One leased message.
#[doc(hidden)]
#[derive(Debug, QueryableByName)]
pub struct OutboxRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) position: i64,
    #[diesel(sql_type = Text)]
    pub(crate) id: String,
    #[diesel(sql_type = Text)]
    pub(crate) destination: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) ordering_key: Option<String>,
    #[diesel(sql_type = Binary)]
    pub(crate) headers: Vec<u8>,
    #[diesel(sql_type = Binary)]
    pub(crate) payload: Vec<u8>,
    #[diesel(sql_type = Integer)]
    pub(crate) attempts: i32,
    #[diesel(sql_type = BigInt)]
    pub(crate) created_micros: i64,
    /// Read for a [`DeletingLease`]'s restore.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) key_seq: Option<i64>,
    /// Read for a [`DeletingLease`]'s restore.
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) last_error: Option<String>,
    /// Read for a [`DeletingLease`]'s restore: when a refused message may
    /// be tried again (microseconds since the Unix epoch).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) retry_micros: Option<i64>,
}

/// One dead message, as [`OutboxSql::list_dead`] reads it.
#[doc(hidden)]
#[derive(Debug, QueryableByName)]
pub struct DeadOutboxRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) position: i64,
    #[diesel(sql_type = Text)]
    pub(crate) id: String,
    #[diesel(sql_type = Text)]
    pub(crate) destination: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) ordering_key: Option<String>,
    #[diesel(sql_type = Integer)]
    pub(crate) attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) last_error: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub(crate) created_micros: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) dead_micros: i64,
}

/// The outbox's backlog, as [`OutboxSql::backlog`] reads it.
#[doc(hidden)]
#[derive(Debug, QueryableByName)]
pub struct BacklogRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) pending: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) dead: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) oldest_micros: Option<i64>,
}
