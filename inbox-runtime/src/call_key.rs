//! Idempotency keys for the calls a handler's body makes to other
//! services: the inbox makes the body's *database* effects happen once,
//! but a call to a payment provider, an e-mail service or another team's
//! API is outside its transaction. A body that called, then failed (or
//! whose process died before the commit), is run again on the redelivery
//! and calls again. Give the call an idempotency key that is the same on
//! every redelivery, and the provider answers the second call with the
//! first one's result instead of acting twice.

use std::borrow::Cow;
use std::fmt;

use sha2::{Digest, Sha256};

use crate::error::InboxError;
use crate::key::{ClaimKey, HandlerName};
use crate::message_id::MessageId;

/// A stable idempotency key for one call a handler's body makes: derived
/// from the handler's scope, the message id and a step name that tells the
/// body's calls apart (`"charge"`, `"notify"`), so it is the same on every
/// delivery of the message, and differs between handlers, messages and
/// steps.
///
/// It reads as a UUID (version 8, RFC 9562's custom version: the first 16
/// bytes of a SHA-256 of the three parts, each length-prefixed, under a
/// fixed label), which any provider's `Idempotency-Key` header takes
/// (Stripe's, the IETF draft's). The message id cannot be read back from
/// it.
///
/// The provider must honour the key at least as long as the broker can
/// redeliver the message (Stripe keeps keys 24 hours): past that, a call
/// repeated under the same key is a new call.
///
/// ```
/// use inbox_runtime::{CallKey, ClaimKey, HandlerName};
///
/// let claim = ClaimKey::new(HandlerName::new("billing.apply_payment")?, "pay-42")?;
/// let charge = CallKey::new(&claim, "charge");
/// assert_eq!(charge, CallKey::new(&claim, "charge")); // every redelivery
/// assert_ne!(charge, CallKey::new(&claim, "refund"));
/// assert_eq!(charge.as_str().len(), 36);
/// assert_eq!(&charge.as_str()[14..15], "8"); // UUID version 8
/// // In an `#[idempotent(id = msg.id, handler = "billing.apply_payment")]` body:
/// // let key = CallKey::of("billing.apply_payment", &msg.id, "charge")?;
/// // provider.charge(msg.amount).idempotency_key(key.as_str()).send()?;
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CallKey(String);

/// What the digest starts with: the scheme and its version.
const LABEL: &[u8] = b"inbox-runtime call key v1";

impl CallKey {
    /// The key of the call `step` made while handling `claim`'s message.
    ///
    /// ```
    /// use inbox_runtime::{CallKey, ClaimKey, HandlerName};
    /// let claim = ClaimKey::new(HandlerName::new("shop.settle")?, "order-7")?;
    /// let key = CallKey::new(&claim, "charge");
    /// # let _ = key;
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn new(claim: &ClaimKey, step: &str) -> CallKey {
        let mut hash = Sha256::new();
        hash.update(LABEL);
        for part in [claim.handler().as_str(), claim.message_id(), step] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        let digest = hash.finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        bytes[6] = (bytes[6] & 0x0f) | 0x80;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        CallKey(format!(
            "{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        ))
    }

    /// The key of the call `step` made while handler `handler` handles the
    /// message `message_id`: [`new`](Self::new) for the body of
    /// `#[idempotent(id = …, handler = "…")]`, with the attribute's two
    /// values. Errors: those of [`HandlerName::new`] and [`ClaimKey::new`]
    /// (a name or id the inbox would refuse).
    ///
    /// ```
    /// use inbox_runtime::CallKey;
    /// let key = CallKey::of("shop.settle", "order-7", "charge")?;
    /// assert_eq!(key.as_str().len(), 36);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn of<M: MessageId + ?Sized>(
        handler: impl Into<Cow<'static, str>>,
        message_id: &M,
        step: &str,
    ) -> Result<CallKey, InboxError> {
        let claim = ClaimKey::new(HandlerName::new(handler)?, message_id)?;
        Ok(CallKey::new(&claim, step))
    }

    /// The key as text (36 characters, a UUID's form).
    ///
    /// ```
    /// # use inbox_runtime::{CallKey, ClaimKey, HandlerName};
    /// # let claim = ClaimKey::new(HandlerName::new("shop.settle")?, "order-7")?;
    /// let header_value = CallKey::new(&claim, "charge").as_str().to_owned();
    /// # let _ = header_value;
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallKey({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::CallKey;
    use crate::key::{ClaimKey, HandlerName};

    fn key(handler: &'static str, id: &str, step: &str) -> CallKey {
        CallKey::new(
            &ClaimKey::new(HandlerName::new(handler).unwrap(), id).unwrap(),
            step,
        )
    }

    #[test]
    fn pinned_and_distinct() {
        // Pinned: a key must never change between versions of the crate,
        // or a redelivery after an upgrade would call again under a new key.
        assert_eq!(
            key("billing.apply_payment", "pay-42", "charge").as_str(),
            PINNED
        );
        // The parts are length-prefixed: moving a boundary changes the key.
        assert_ne!(key("a", "bc", "d"), key("a", "b", "cd"));
        assert_ne!(key("ab", "c", "d"), key("a", "bc", "d"));
    }

    /// Computed independently (Python's hashlib) from the documented scheme.
    const PINNED: &str = "2949c75a-7d4e-8ca9-b628-10060cee0020";
}
