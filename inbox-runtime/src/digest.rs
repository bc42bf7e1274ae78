//! The payload fingerprint as a value: 32 bytes of SHA-256, stored with a
//! claim and shown as hex. At the bottom of the runtime, beside the error
//! type that reports a mismatch; how a payload is encoded and hashed is
//! [`fingerprint`](crate::fingerprint)'s.

use std::fmt;

/// A stable hash of a message's payload, stored with its claim (see the
/// [`fingerprint`](crate::fingerprint) module for the algorithm).
///
/// ```
/// use inbox_runtime::Fingerprint;
/// let a = Fingerprint::of("amount=250")?;
/// assert_eq!(a, Fingerprint::of(&String::from("amount=250"))?);
/// assert_ne!(a, Fingerprint::of("amount=251")?);
/// assert_eq!(a.as_bytes().len(), 32);
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint whose digest is `bytes` (the hashing is
    /// [`fingerprint`](crate::fingerprint)'s).
    pub(crate) fn from_digest(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// The 32 bytes as stored.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::Fingerprint::of("x")?.as_bytes().len(), 32);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The fingerprint read back from the database; `None` unless it is 32
    /// bytes long.
    ///
    /// ```
    /// use inbox_runtime::Fingerprint;
    /// let stored = Fingerprint::of("x")?;
    /// assert_eq!(Fingerprint::from_stored(stored.as_bytes()), Some(stored));
    /// assert_eq!(Fingerprint::from_stored(b"short"), None);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn from_stored(bytes: &[u8]) -> Option<Fingerprint> {
        bytes.try_into().ok().map(Fingerprint)
    }

    /// The lowercase hex form (64 characters), as logs and errors show it.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::Fingerprint::of("x")?.to_hex().len(), 64);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|byte| format!("{byte:02x}")).collect()
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
