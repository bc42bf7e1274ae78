//! Validated `(handler, message id)` pairs: what a claim inserts.

use std::borrow::Cow;
use std::fmt;

use crate::error::{InboxError, KeyProblem};
use crate::fingerprint::Fingerprint;
use crate::message_id::{IdText, MessageId};

/// The longest message id the inbox stores, in UTF-8 bytes.
///
/// Every backend's schema enforces the same limit, and ids are checked against
/// it before a transaction starts, so an oversized id is a typed
/// [`InboxError::InvalidMessageId`] and never a truncated key.
///
/// ```
/// assert_eq!(inbox_runtime::MAX_MESSAGE_ID_BYTES, 255);
/// ```
pub const MAX_MESSAGE_ID_BYTES: usize = 255;

/// The longest handler name (deduplication scope), in UTF-8 bytes.
///
/// ```
/// assert_eq!(inbox_runtime::MAX_HANDLER_BYTES, 255);
/// ```
pub const MAX_HANDLER_BYTES: usize = 255;

/// The deduplication scope of a handler: two handlers that receive the same
/// message each process it once, because each claims the id under its own
/// name.
///
/// The `#[idempotent]` attribute uses the function's path
/// (`module_path!()::name`) unless `handler = "..."` is given. A name written
/// out is better for long-lived services: renaming or moving the function then
/// does not open a window in which old ids are forgotten.
///
/// ```
/// use inbox_runtime::HandlerName;
///
/// let name = HandlerName::new("billing.apply_payment")?;
/// assert_eq!(name.as_str(), "billing.apply_payment");
/// assert!(HandlerName::new("").is_err());
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HandlerName(Cow<'static, str>);

impl HandlerName {
    /// Checks a handler name: non-empty, at most [`MAX_HANDLER_BYTES`] bytes,
    /// no NUL character.
    ///
    /// ```
    /// assert!(inbox_runtime::HandlerName::new("shipping").is_ok());
    /// ```
    pub fn new(name: impl Into<Cow<'static, str>>) -> Result<Self, InboxError> {
        let name = name.into();
        match check_text(&name, MAX_HANDLER_BYTES) {
            None => Ok(HandlerName(name)),
            Some(problem) => Err(InboxError::InvalidHandlerName {
                handler: preview(&name),
                problem,
            }),
        }
    }

    /// A name checked when the handler was compiled (see
    /// [`__private::claim_key`](crate::__private::claim_key)): kept as it
    /// is, without checking it again on every delivery.
    pub(crate) fn from_checked(name: &'static str) -> Self {
        debug_assert!(check_text(name, MAX_HANDLER_BYTES).is_none(), "{name:?}");
        HandlerName(Cow::Borrowed(name))
    }

    /// The name as stored in the inbox's `handler` column.
    ///
    /// ```
    /// let name = inbox_runtime::HandlerName::new("a.b").unwrap();
    /// assert_eq!(name.as_str(), "a.b");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as kept: borrowed for the `&'static str` names
    /// `#[idempotent]` uses, so a metric label copies no text.
    #[cfg(feature = "metrics")]
    pub(crate) fn as_cow(&self) -> &Cow<'static, str> {
        &self.0
    }
}

impl fmt::Display for HandlerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated `(handler, message id)` pair, ready to be claimed.
///
/// Building one is where bad input is caught: an empty id, one longer than
/// [`MAX_MESSAGE_ID_BYTES`], one containing NUL, a missing one (`None`), or
/// bytes that are not UTF-8 is an [`InboxError::InvalidMessageId`], raised
/// before any transaction starts, so nothing is recorded and the handler's
/// body does not run.
///
/// ```
/// use inbox_runtime::{ClaimKey, HandlerName, InboxError};
///
/// let handler = HandlerName::new("billing")?;
/// let key = ClaimKey::new(handler.clone(), &"pay-1")?;
/// assert_eq!(key.message_id(), "pay-1");
/// assert_eq!(key.handler().as_str(), "billing");
///
/// let err = ClaimKey::new(handler, &"").unwrap_err();
/// assert!(err.is_invalid_message());
/// assert!(!err.is_retryable());
/// # Ok::<(), InboxError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimKey {
    handler: HandlerName,
    message_id: IdText,
    /// The payload's fingerprint, stored with the claim and compared on a
    /// duplicate (see [`ClaimKey::with_fingerprint`]).
    fingerprint: Option<Fingerprint>,
}

impl ClaimKey {
    /// Validates `id` (read with [`MessageId::try_message_id`]) and pairs it
    /// with `handler`.
    ///
    /// ```
    /// use inbox_runtime::{ClaimKey, HandlerName, InboxError, KeyProblem};
    /// let key = ClaimKey::new(HandlerName::new("h")?, &42_u64)?;
    /// assert_eq!(key.message_id(), "42");
    ///
    /// let missing = ClaimKey::new(HandlerName::new("h")?, &None::<String>).unwrap_err();
    /// assert!(matches!(missing, InboxError::InvalidMessageId { problem: KeyProblem::Missing, .. }));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn new<M: MessageId + ?Sized>(handler: HandlerName, id: &M) -> Result<Self, InboxError> {
        let message_id = match id.claim_text() {
            Ok(text) => text,
            // No text to check or to show: an absent id, bytes that are not UTF-8.
            Err(problem) => {
                return Err(InboxError::InvalidMessageId {
                    handler: handler.as_str().to_owned(),
                    message_id: String::new(),
                    problem,
                });
            }
        };
        match check_text(message_id.as_str(), MAX_MESSAGE_ID_BYTES) {
            None => Ok(ClaimKey {
                handler,
                message_id,
                fingerprint: None,
            }),
            Some(problem) => Err(InboxError::InvalidMessageId {
                handler: handler.as_str().to_owned(),
                message_id: preview(message_id.as_str()),
                problem,
            }),
        }
    }

    /// The error for a key whose text the database refused to store: the
    /// message id's, unless the id is plain ASCII and the handler name is
    /// not (then the name is the text the server could not take).
    pub(crate) fn refused_by_database(&self) -> InboxError {
        let handler = self.handler.as_str();
        let message_id = self.message_id.as_str();
        if message_id.is_ascii() && !handler.is_ascii() {
            InboxError::InvalidHandlerName {
                handler: preview(handler),
                problem: KeyProblem::RefusedByDatabase,
            }
        } else {
            InboxError::InvalidMessageId {
                handler: handler.to_owned(),
                message_id: preview(message_id),
                problem: KeyProblem::RefusedByDatabase,
            }
        }
    }

    /// The key with the payload's fingerprint (what
    /// `#[idempotent(fingerprint = …)]` adds): the claim stores it, and a
    /// later delivery of the same id with another fingerprint is refused
    /// with [`InboxError::Conflict`] instead of being taken for a duplicate.
    /// A claim stored without a fingerprint (by a handler without one, or
    /// before the inbox had the column) matches any.
    ///
    /// ```
    /// use inbox_runtime::{ClaimKey, Fingerprint, HandlerName};
    /// let key = ClaimKey::new(HandlerName::new("h")?, "m")?
    ///     .with_fingerprint(Fingerprint::of("amount=250")?);
    /// assert_eq!(key.fingerprint(), Some(&Fingerprint::of("amount=250")?));
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn with_fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// The payload's fingerprint, if the key carries one.
    ///
    /// ```
    /// # use inbox_runtime::{ClaimKey, HandlerName};
    /// assert_eq!(ClaimKey::new(HandlerName::new("h")?, "m")?.fingerprint(), None);
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn fingerprint(&self) -> Option<&Fingerprint> {
        self.fingerprint.as_ref()
    }

    /// Whether `other` claims the same row: the same handler and message
    /// id, whatever the fingerprints.
    pub(crate) fn same_claim(&self, other: &ClaimKey) -> bool {
        self.handler == other.handler && self.message_id == other.message_id
    }

    /// The handler (deduplication scope) the id is claimed under.
    ///
    /// ```
    /// # use inbox_runtime::{ClaimKey, HandlerName};
    /// let key = ClaimKey::new(HandlerName::new("h")?, "m")?;
    /// assert_eq!(key.handler().as_str(), "h");
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn handler(&self) -> &HandlerName {
        &self.handler
    }

    /// The message id as stored.
    ///
    /// ```
    /// # use inbox_runtime::{ClaimKey, HandlerName};
    /// let key = ClaimKey::new(HandlerName::new("h")?, "m")?;
    /// assert_eq!(key.message_id(), "m");
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn message_id(&self) -> &str {
        self.message_id.as_str()
    }
}

/// Whether `name` is a valid handler name ([`HandlerName::new`]'s checks),
/// at compile time.
pub(crate) const fn is_valid_handler_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_HANDLER_BYTES {
        return false;
    }
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == 0 {
            return false;
        }
        at += 1;
    }
    true
}

/// What is wrong with a handler name or message id, if anything.
fn check_text(text: &str, max_bytes: usize) -> Option<KeyProblem> {
    if text.is_empty() {
        Some(KeyProblem::Empty)
    } else if text.len() > max_bytes {
        Some(KeyProblem::TooLong {
            bytes: text.len(),
            max_bytes,
        })
    } else {
        text.find('\0')
            .map(|byte_offset| KeyProblem::ContainsNul { byte_offset })
    }
}

/// A bounded, printable copy of rejected input for error messages.
pub(crate) fn preview(text: &str) -> String {
    const SHOWN_CHARS: usize = 64;
    let mut shown: String = text
        .chars()
        .take(SHOWN_CHARS)
        .flat_map(char::escape_default)
        .collect();
    if text.chars().count() > SHOWN_CHARS {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handler() -> HandlerName {
        HandlerName::new("h").unwrap()
    }

    #[test]
    fn accepts_ids_up_to_the_limit() {
        let id = "é".repeat(MAX_MESSAGE_ID_BYTES / 2) + "x";
        assert_eq!(id.len(), MAX_MESSAGE_ID_BYTES);
        assert_eq!(ClaimKey::new(handler(), &id).unwrap().message_id(), id);
    }

    #[test]
    fn rejects_empty_long_and_nul_ids() {
        let problem = |id: &str| match ClaimKey::new(handler(), id) {
            Err(InboxError::InvalidMessageId { problem, .. }) => problem,
            other => panic!("expected an invalid id, got {other:?}"),
        };
        assert_eq!(problem(""), KeyProblem::Empty);
        assert_eq!(
            problem(&"x".repeat(256)),
            KeyProblem::TooLong {
                bytes: 256,
                max_bytes: 255
            }
        );
        assert_eq!(problem("a\0b"), KeyProblem::ContainsNul { byte_offset: 1 });
    }

    fn problem_of<M: MessageId + ?Sized>(id: &M) -> KeyProblem {
        match ClaimKey::new(handler(), id) {
            Err(InboxError::InvalidMessageId { problem, .. }) => problem,
            other => panic!("expected an invalid id, got {other:?}"),
        }
    }

    #[test]
    fn a_missing_id_is_a_typed_error() {
        assert_eq!(problem_of(&None::<String>), KeyProblem::Missing);
        assert_eq!(problem_of(&&None::<&str>), KeyProblem::Missing);
        assert_eq!(problem_of(&Box::new(None::<u64>)), KeyProblem::Missing);
        // `Some` is checked as its content is.
        assert_eq!(problem_of(&Some(String::new())), KeyProblem::Empty);
        assert_eq!(
            ClaimKey::new(handler(), &Some("m-1")).unwrap().message_id(),
            "m-1"
        );
        let err = ClaimKey::new(handler(), &None::<String>).unwrap_err();
        assert!(err.is_invalid_message());
        assert!(!err.is_retryable());
        assert_eq!(
            err.to_string(),
            "invalid message id for handler `h`: the message carries no id, so it cannot be \
             deduplicated; redelivering it will not help"
        );
    }

    #[test]
    fn bytes_must_be_utf8() {
        assert_eq!(
            ClaimKey::new(handler(), "é-1".as_bytes())
                .unwrap()
                .message_id(),
            "é-1"
        );
        assert_eq!(
            problem_of(b"ab\xffcd".as_slice()),
            KeyProblem::NotUtf8 { valid_up_to: 2 }
        );
        // A truncated multi-byte character is refused too.
        assert_eq!(
            problem_of(&"é".as_bytes()[..1].to_vec()),
            KeyProblem::NotUtf8 { valid_up_to: 0 }
        );
        assert_eq!(problem_of(&Some(b"".as_slice())), KeyProblem::Empty);
        let err = ClaimKey::new(handler(), b"\xff".as_slice()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid message id for handler `h`: it is not UTF-8 text (the byte at offset 0 \
             is invalid), and the inbox stores ids as text without a lossy conversion; the \
             message is malformed and redelivering it will not help"
        );
    }

    #[test]
    fn errors_show_a_bounded_escaped_preview() {
        let err = ClaimKey::new(handler(), &"\0".repeat(300)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("\\u{0}"), "{text}");
        assert!(text.len() < 600, "{text}");
    }

    #[test]
    fn rejects_bad_handler_names() {
        assert!(HandlerName::new("").is_err());
        assert!(HandlerName::new("x".repeat(256)).is_err());
        assert!(HandlerName::new("a\0").is_err());
        assert!(HandlerName::new("x".repeat(255)).is_ok());
        // The compile-time check agrees.
        assert!(!is_valid_handler_name(""));
        assert!(!is_valid_handler_name(&"x".repeat(256)));
        assert!(!is_valid_handler_name("a\0"));
        assert!(is_valid_handler_name(&"x".repeat(255)));
        const { assert!(is_valid_handler_name("billing.apply")) };
    }
}
