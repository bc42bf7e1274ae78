//! Payload fingerprints: what tells a redelivery of a message from a
//! different message that reuses its id.
//!
//! A handler declared with `#[idempotent(id = …, fingerprint = …)]` stores
//! a [`Fingerprint`] of the expression's value with its claim. A later
//! delivery of the same id is a duplicate only if its fingerprint is the
//! same; a different one is [`InboxError::Conflict`](crate::InboxError):
//! the body does not run, and the acknowledgement decision dead-letters the
//! delivery.
//!
//! # The algorithm (version 1)
//!
//! The fingerprint is the SHA-256 digest of the byte `0x01` (the encoding's
//! version) followed by the value's canonical encoding:
//!
//! | value | encoding |
//! |---|---|
//! | text (`str`, `String`; `char` with the `serde` feature) | `s`, length as 8 bytes big-endian, the UTF-8 bytes |
//! | bytes (`[u8]`, `Vec<u8>`), and any sequence whose elements are all integers from 0 to 255 | `b`, length as 8 bytes big-endian, the bytes |
//!
//! With the `serde` feature, any `serde::Serialize` value, encoded through
//! serde's data model (so a map's iteration order does not matter, and a
//! struct is the map of its fields). It is close to the value's JSON form
//! but finer, so two values with the same JSON can differ: an integer is
//! not a float, an `f32` is widened to `f64` (`0.1_f32` is not `0.1_f64`),
//! a map's integer keys stay integers (`{1: …}` is not `{"1": …}`), and a
//! NaN is not `None`:
//!
//! | value | encoding |
//! |---|---|
//! | `()`, `None`, unit structs | `n` |
//! | `bool` | `t` or `f` |
//! | integers (any width, signed or not) | `i`, the value as a 16-byte big-endian two's-complement `i128` (`u128` above `i128::MAX`: `u`, 16 bytes big-endian) |
//! | `f32`, `f64` | `d`, the `f64` bits big-endian (every NaN as `0x7ff8000000000000`) |
//! | `Some(v)`, newtype structs | `v`'s encoding |
//! | other sequences, tuples | `a`, count as 8 bytes big-endian, the elements' encodings |
//! | maps, structs | `m`, count as 8 bytes big-endian, then each entry's key and value encodings, entries sorted by the key's encoding (bytewise) |
//! | enum variants | as serde_json's externally tagged form: a unit variant is its name as text; any other is a one-entry map from its name to its content |
//!
//! The encoding depends on the value only: not on the platform, the
//! process, the map's iteration order or this crate's version (a future
//! encoding would start with another version byte, and a stored fingerprint
//! of version 1 would keep meaning what it means). The test vector:
//!
//! ```
//! use inbox_runtime::Fingerprint;
//! assert_eq!(
//!     Fingerprint::of("hello")?.to_hex(),
//!     "a7126ef190e44729fdbe96ecd8a3a229303e82195c0415bf69bb83124172e3d7",
//! );
//! assert_eq!(Fingerprint::of(&b"hello"[..])?, Fingerprint::of(&vec![104_u8, 101, 108, 108, 111])?);
//! # Ok::<(), inbox_runtime::InboxError>(())
//! ```

#[cfg(feature = "serde")]
mod canonical;

use sha2::{Digest, Sha256};

pub use crate::digest::Fingerprint;
use crate::error::InboxError;

/// The version byte the digest starts with.
const ENCODING_VERSION: u8 = 1;
/// The tag of text.
const TEXT: u8 = b's';
/// The tag of bytes.
const BYTES: u8 = b'b';

impl Fingerprint {
    /// The fingerprint of `value`. Text and bytes never fail; a
    /// `serde::Serialize` value fails with [`InboxError::InvalidFingerprint`]
    /// when its `Serialize` implementation returns an error.
    ///
    /// ```
    /// let fingerprint = inbox_runtime::Fingerprint::of(&b"\x00\x01"[..])?;
    /// assert_eq!(fingerprint.as_bytes().len(), 32);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn of<T: Fingerprinted + ?Sized>(value: &T) -> Result<Fingerprint, InboxError> {
        value.fingerprint()
    }

    /// The fingerprint of an already encoded value (version byte included).
    #[cfg_attr(not(any(feature = "serde", test)), allow(dead_code))]
    fn of_encoding(encoding: &[u8]) -> Fingerprint {
        Fingerprint::from_digest(Sha256::digest(encoding).into())
    }

    /// The fingerprint of text or bytes, hashed in place.
    #[cfg_attr(feature = "serde", allow(dead_code))]
    fn of_tagged(tag: u8, bytes: &[u8]) -> Fingerprint {
        let mut digest = Sha256::new();
        digest.update([ENCODING_VERSION, tag]);
        digest.update((bytes.len() as u64).to_be_bytes());
        digest.update(bytes);
        Fingerprint::from_digest(digest.finalize().into())
    }
}

/// A value whose [`Fingerprint`] can be taken: what
/// `#[idempotent(fingerprint = …)]` accepts.
///
/// Implemented for text (`str`, `String`) and bytes (`[u8]`, `Vec<u8>`)
/// and references to them; with the `serde` feature, for every
/// `serde::Serialize` type instead (text and bytes keep the same
/// fingerprints, see the [module documentation](crate::fingerprint)).
///
/// ```
/// use inbox_runtime::{Fingerprint, Fingerprinted};
/// let body: &[u8] = b"{\"amount\":250}";
/// assert_eq!(body.fingerprint()?, Fingerprint::of(body)?);
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be fingerprinted",
    label = "`fingerprint = …` needs the message's payload as text, bytes or a `serde::Serialize` value",
    note = "pass the raw payload (`&str`, `String`, `&[u8]`, `Vec<u8>`), or enable the `serde` feature of `inbox-runtime` and derive `serde::Serialize` for `{Self}`"
)]
pub trait Fingerprinted {
    /// The value's fingerprint (see [`Fingerprint::of`]).
    fn fingerprint(&self) -> Result<Fingerprint, InboxError>;
}

#[cfg(not(feature = "serde"))]
mod direct {
    use super::{BYTES, Fingerprint, Fingerprinted, InboxError, TEXT};

    impl Fingerprinted for str {
        fn fingerprint(&self) -> Result<Fingerprint, InboxError> {
            Ok(Fingerprint::of_tagged(TEXT, self.as_bytes()))
        }
    }

    impl Fingerprinted for String {
        fn fingerprint(&self) -> Result<Fingerprint, InboxError> {
            self.as_str().fingerprint()
        }
    }

    impl Fingerprinted for [u8] {
        fn fingerprint(&self) -> Result<Fingerprint, InboxError> {
            Ok(Fingerprint::of_tagged(BYTES, self))
        }
    }

    impl Fingerprinted for Vec<u8> {
        fn fingerprint(&self) -> Result<Fingerprint, InboxError> {
            self.as_slice().fingerprint()
        }
    }

    impl<T: Fingerprinted + ?Sized> Fingerprinted for &T {
        fn fingerprint(&self) -> Result<Fingerprint, InboxError> {
            (**self).fingerprint()
        }
    }

    impl<T: Fingerprinted + ?Sized> Fingerprinted for Box<T> {
        fn fingerprint(&self) -> Result<Fingerprint, InboxError> {
            (**self).fingerprint()
        }
    }
}

#[cfg(feature = "serde")]
impl<T: serde::Serialize + ?Sized> Fingerprinted for T {
    fn fingerprint(&self) -> Result<Fingerprint, InboxError> {
        canonical::fingerprint(self).map_err(|error| InboxError::InvalidFingerprint {
            reason: crate::text::error_text(&error),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_bytes_follow_the_documented_encoding() {
        let mut encoding = vec![ENCODING_VERSION, TEXT];
        encoding.extend_from_slice(&5_u64.to_be_bytes());
        encoding.extend_from_slice(b"hello");
        assert_eq!(
            Fingerprint::of("hello").unwrap(),
            Fingerprint::of_encoding(&encoding)
        );
        encoding[1] = BYTES;
        let bytes = Fingerprint::of(&b"hello"[..]).unwrap();
        assert_eq!(bytes, Fingerprint::of_encoding(&encoding));
        assert_ne!(Fingerprint::of("hello").unwrap(), bytes);
    }

    #[test]
    fn the_test_vector_is_sha256_of_the_encoding() {
        // sha256(01 73 0000000000000005 68656c6c6f), computed independently
        // with `printf '\x01s\0\0\0\0\0\0\0\x05hello' | sha256sum`.
        assert_eq!(
            Fingerprint::of("hello").unwrap().to_hex(),
            "a7126ef190e44729fdbe96ecd8a3a229303e82195c0415bf69bb83124172e3d7"
        );
    }
}
