//! The outgoing message's id: a UUID version 7 (RFC 9562), made when the
//! message is recorded.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The id of an outgoing message: a UUID version 7 in its text form
/// (`0193a8f2-6c1e-7a3b-9d41-5f0e2c7b8a19`), made when the message is
/// recorded and sent as the broker's message id (AMQP `message_id`,
/// JetStream's `Nats-Msg-Id`), so that a downstream inbox, or JetStream's
/// duplicate window, absorbs a second publish of the same message.
///
/// Its first 48 bits are the Unix time in milliseconds and the next 12 a
/// counter within the millisecond, so ids made later sort later (in one
/// process, strictly: a clock that steps back does not reorder them): a
/// downstream inbox's unique index grows at its right edge, where a claim
/// costs the same however large the table is (BENCHMARKS.md, "Claim cost as
/// the inbox grows"). The last 62 bits are random.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::outbox::{self, OutgoingMessage};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let (first, second) = conn.transaction(|conn| {
///     let first = outbox::send(conn, &OutgoingMessage::new("receipts", "a"))?;
///     let second = outbox::send(conn, &OutgoingMessage::new("receipts", "b"))?;
///     Ok::<_, inbox_runtime::InboxError>((first, second))
/// })?;
/// assert!(first < second, "time-ordered");
/// assert_eq!(first.as_str().len(), 36);
/// assert_eq!(&first.as_str()[14..15], "7", "version 7");
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OutboxId(String);

impl OutboxId {
    /// A new id, later than every id this process made before.
    pub(crate) fn generate() -> OutboxId {
        let (millis, counter) = next_tick();
        let random = random_bits(millis, counter);
        let high = (millis << 16) | 0x7000 | u64::from(counter);
        let low = (random & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
        OutboxId(format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xFFFF,
            high & 0xFFFF,
            low >> 48,
            low & 0xFFFF_FFFF_FFFF
        ))
    }

    /// An id read back from the outbox table.
    pub(crate) fn from_stored(id: String) -> OutboxId {
        OutboxId(id)
    }

    /// The id's text.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// # use diesel::prelude::*;
    /// # use inbox_runtime::outbox::{self, OutgoingMessage};
    /// # let mut conn = SqliteConnection::establish(":memory:")?;
    /// # inbox_runtime::setup(&mut conn)?;
    /// let id = conn.transaction(|conn| outbox::send(conn, &OutgoingMessage::new("q", "x")))?;
    /// assert!(id.as_str().chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OutboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for OutboxId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The last (milliseconds, counter) handed out, so ids never go back.
static LAST_TICK: Mutex<(u64, u16)> = Mutex::new((0, 0));

/// The next (milliseconds, counter): the clock's millisecond if it moved
/// past the last one, else the last one's counter plus one (carrying into
/// the next millisecond when the 12 bits run out).
fn next_tick() -> (u64, u16) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
        & 0xFFFF_FFFF_FFFF;
    let mut last = LAST_TICK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    *last = if now > last.0 {
        (now, 0)
    } else if last.1 < 0x0FFF {
        (last.0, last.1 + 1)
    } else {
        (last.0 + 1, 0)
    };
    *last
}

/// 64 bits no other id of this process or, with overwhelming likelihood,
/// of another process shares: the tick and a process-wide count hashed
/// with a key std seeds from the operating system's randomness.
fn random_bits(millis: u64, counter: u16) -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one((
        millis,
        counter,
        COUNT.fetch_add(1, Ordering::Relaxed),
        std::process::id(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_uuid_v7_and_strictly_increasing() {
        let ids: Vec<OutboxId> = (0..10_000).map(|_| OutboxId::generate()).collect();
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
        for id in &ids {
            let text = id.as_str();
            assert_eq!(text.len(), 36);
            assert_eq!(&text[14..15], "7");
            assert!(matches!(&text[19..20], "8" | "9" | "a" | "b"), "{text}");
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let first = u64::from_str_radix(&ids[0].as_str()[..8], 16).unwrap() << 16
            | u64::from_str_radix(&ids[0].as_str()[9..13], 16).unwrap();
        assert!(now.abs_diff(first) < 60_000, "milliseconds since the epoch");
    }

    #[test]
    fn random_bits_differ() {
        let bits: std::collections::HashSet<u64> = (0..1000).map(|_| random_bits(1, 1)).collect();
        assert_eq!(bits.len(), 1000);
    }
}
