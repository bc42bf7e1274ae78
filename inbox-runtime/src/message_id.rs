//! Types that can serve as a producer-assigned message id.

use std::borrow::Cow;
use std::rc::Rc;
use std::sync::Arc;

use crate::error::KeyProblem;

/// A value that identifies one message, assigned by its producer.
///
/// The inbox stores ids as text. This trait is implemented for strings,
/// integers, UTF-8 bytes (`[u8]`, `Vec<u8>`: a Kafka header's value),
/// `Option`s of ids (`None` is a message without an id), [`uuid::Uuid`]
/// (with the `uuid` feature), broker clients' id types (with the `lapin`
/// and `async-nats` features, see below) and references or smart pointers
/// to them. Floats, `bool`, `char` and structs are not ids: implement
/// `MessageId` for a newtype of your own if your envelope carries a
/// composite key, and make the text stable across releases, since it is
/// what deduplicates redeliveries.
///
/// ```
/// use inbox_runtime::MessageId;
///
/// assert_eq!("order-17".to_message_id(), "order-17");
/// assert_eq!(42_u64.to_message_id(), "42");
///
/// /// The producer's name and its own sequence number.
/// struct EventKey { producer: &'static str, sequence: u64 }
/// impl MessageId for EventKey {
///     fn to_message_id(&self) -> std::borrow::Cow<'_, str> {
///         format!("{}:{}", self.producer, self.sequence).into()
///     }
/// }
/// assert_eq!(EventKey { producer: "billing", sequence: 9 }.to_message_id(), "billing:9");
/// ```
///
/// # An id that may be absent or malformed
///
/// [`try_message_id`](MessageId::try_message_id) is what a claim reads: it
/// returns the text, or the [`KeyProblem`] that makes the message
/// unprocessable, which the handler reports as
/// [`InboxError::InvalidMessageId`](crate::InboxError::InvalidMessageId)
/// (not retried: [`ack_decision`](crate::ack_decision) dead-letters it)
/// without opening a transaction. Its default is `Ok(to_message_id())`;
/// `Option` returns [`KeyProblem::Missing`] for `None`, and bytes return
/// [`KeyProblem::NotUtf8`] when they are not UTF-8 (they are never converted
/// lossily). For those, [`to_message_id`](MessageId::to_message_id) returns
/// the empty string, which no claim accepts.
///
/// ```
/// use inbox_runtime::{KeyProblem, MessageId};
///
/// let absent: Option<String> = None;
/// assert_eq!(absent.try_message_id(), Err(KeyProblem::Missing));
/// assert_eq!(Some("m-1").try_message_id().as_deref(), Ok("m-1"));
/// assert_eq!(b"m-\xff".as_slice().try_message_id(), Err(KeyProblem::NotUtf8 { valid_up_to: 2 }));
/// ```
///
/// # Broker clients' id types
///
/// With the `lapin` feature, `amq_protocol_types::ShortString` (lapin's
/// `lapin::types::ShortString`, the type of the AMQP `message_id` property)
/// is an id, so `id = delivery.properties.message_id()` (an
/// `&Option<ShortString>`) compiles as it is. With the `async-nats` feature,
/// `async_nats::HeaderValue` is an id, so the JetStream `Nats-Msg-Id` header
/// is one too: `id = message.headers.as_ref().and_then(|h|
/// h.get(async_nats::header::NATS_MESSAGE_ID))` (an `Option<&HeaderValue>`).
/// Name the header with that constant rather than the string
/// `"Nats-Msg-Id"`: async-nats 0.46 does not find a standard header
/// received from the server by its name as a string (0.47 and later do), so
/// every message would seem to have no id.
///
/// ```
/// # #[cfg(all(feature = "lapin", feature = "async-nats"))] {
/// use inbox_runtime::{KeyProblem, MessageId};
///
/// // lapin: `delivery.properties.message_id()`.
/// let message_id: Option<amq_protocol_types::ShortString> = Some("order-17".into());
/// assert_eq!((&message_id).try_message_id().as_deref(), Ok("order-17"));
///
/// // async-nats: `message.headers.as_ref().and_then(|h| h.get(NATS_MESSAGE_ID))`.
/// let headers: Option<async_nats::HeaderMap> = None;
/// let id = headers.as_ref().and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID));
/// assert_eq!(id.try_message_id(), Err(KeyProblem::Missing));
/// # }
/// ```
///
/// The impls are for the versions inbox-runtime's requirement resolves to:
/// `amq-protocol-types` 8.3 to 10 (lapin 3.7 to 4), `async-nats` 0.46 to
/// 0.51. When your lockfile has two versions of the crate (`cargo tree -d`
/// lists them), your client's type is not the one implemented, and the id
/// expression is refused as "cannot serve as a message id": make them one
/// with `cargo update -p async-nats@<the version inbox-runtime got>
/// --precise <your client's version>` (or `-p amq-protocol-types@…`).
///
/// Why not every `T: AsRef<str>`, which would cover such types without a
/// feature? Rust's coherence rules forbid it next to the impls above:
/// `String`, `&T` and `Box<T>` implement `AsRef<str>` already, and for
/// `u64`, `Option<T>` or `uuid::Uuid` the compiler must assume that their
/// crate may add `AsRef<str>` in a later release, so the blanket impl would
/// overlap them. Each type is named instead. For a type not covered,
/// implement `MessageId` on a newtype, or pass its text (`id =
/// msg.header.as_str()`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot serve as a message id",
    label = "this id expression has type `{Self}`",
    note = "a message id is the producer's stable id as a string, UTF-8 bytes, an integer, a `uuid::Uuid` (feature `uuid`), a lapin `ShortString` (feature `lapin`), an async-nats `HeaderValue` (feature `async-nats`), or an `Option` of one; implement `inbox_runtime::MessageId` for an id type of your own"
)]
pub trait MessageId {
    /// The id as the text stored in the inbox.
    ///
    /// ```
    /// use inbox_runtime::MessageId;
    /// assert_eq!(7_u32.to_message_id(), "7");
    /// ```
    fn to_message_id(&self) -> Cow<'_, str>;

    /// The id as the text stored in the inbox, or why the message has none
    /// the inbox can store. Claims read the id through this method.
    ///
    /// The default is `Ok(self.to_message_id())`; override it for an id
    /// that can be absent or malformed, and return the problem (such as
    /// [`KeyProblem::Missing`]): the handler then fails with
    /// [`InboxError::InvalidMessageId`](crate::InboxError::InvalidMessageId)
    /// and the body does not run.
    ///
    /// ```
    /// use std::borrow::Cow;
    /// use inbox_runtime::{KeyProblem, MessageId};
    ///
    /// /// An envelope whose `id` field may be blank.
    /// struct Envelope { id: String }
    /// impl MessageId for Envelope {
    ///     fn to_message_id(&self) -> Cow<'_, str> {
    ///         Cow::Borrowed(&self.id)
    ///     }
    ///     fn try_message_id(&self) -> Result<Cow<'_, str>, KeyProblem> {
    ///         if self.id.trim().is_empty() { Err(KeyProblem::Missing) } else { Ok(self.to_message_id()) }
    ///     }
    /// }
    /// assert_eq!(Envelope { id: " ".into() }.try_message_id(), Err(KeyProblem::Missing));
    /// assert_eq!(Envelope { id: "a".into() }.try_message_id().as_deref(), Ok("a"));
    /// ```
    fn try_message_id(&self) -> Result<Cow<'_, str>, KeyProblem> {
        Ok(self.to_message_id())
    }

    /// The id's text as a [`ClaimKey`](crate::ClaimKey) keeps it: what
    /// [`try_message_id`](MessageId::try_message_id) returns, copied into
    /// the key. Integers and UUIDs write their text straight into the key,
    /// without a heap string. Not meant to be overridden.
    #[doc(hidden)]
    fn claim_text(&self) -> Result<IdText, KeyProblem> {
        self.try_message_id().map(IdText::from)
    }
}

/// The text of a message id inside a [`ClaimKey`](crate::ClaimKey): kept in
/// the key itself up to [`IdText::INLINE_BYTES`] bytes (every integer, a
/// UUID, most ids brokers assign), so building a key allocates nothing;
/// longer ids are a `String`.
#[doc(hidden)]
#[derive(Clone)]
pub struct IdText(Repr);

#[derive(Clone)]
enum Repr {
    Inline {
        len: u8,
        bytes: [u8; IdText::INLINE_BYTES],
    },
    Heap(String),
}

impl IdText {
    /// The longest id kept inline.
    pub const INLINE_BYTES: usize = 64;

    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Copied from a `str` at a character boundary (see `inline`).
            Repr::Inline { len, bytes } => std::str::from_utf8(&bytes[..usize::from(*len)])
                .expect("an inline id is the bytes of a str"),
            Repr::Heap(text) => text,
        }
    }

    /// `text`, inline when it fits.
    fn inline(text: &str) -> Option<Self> {
        let len = u8::try_from(text.len())
            .ok()
            .filter(|&len| usize::from(len) <= Self::INLINE_BYTES)?;
        let mut bytes = [0; Self::INLINE_BYTES];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(IdText(Repr::Inline { len, bytes }))
    }

    /// What `Display` writes, inline (`value`'s text is at most
    /// [`INLINE_BYTES`](Self::INLINE_BYTES) long: an integer).
    fn display(value: &dyn std::fmt::Display) -> Self {
        use std::io::Write;
        let mut bytes = [0; Self::INLINE_BYTES];
        let mut cursor = std::io::Cursor::new(&mut bytes[..]);
        match write!(cursor, "{value}") {
            Ok(()) => {
                let len = cursor.position() as usize;
                match std::str::from_utf8(&bytes[..len]) {
                    Ok(text) => Self::inline(text),
                    Err(_) => None,
                }
            }
            Err(_) => None,
        }
        .unwrap_or_else(|| IdText(Repr::Heap(value.to_string())))
    }
}

impl From<Cow<'_, str>> for IdText {
    fn from(text: Cow<'_, str>) -> Self {
        match IdText::inline(&text) {
            Some(inline) => inline,
            None => IdText(Repr::Heap(text.into_owned())),
        }
    }
}

impl std::fmt::Debug for IdText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq for IdText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for IdText {}

impl std::hash::Hash for IdText {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl MessageId for str {
    fn to_message_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl MessageId for String {
    fn to_message_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl MessageId for Cow<'_, str> {
    fn to_message_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}

impl<T: MessageId + ?Sized> MessageId for &T {
    fn to_message_id(&self) -> Cow<'_, str> {
        (**self).to_message_id()
    }

    fn try_message_id(&self) -> Result<Cow<'_, str>, KeyProblem> {
        (**self).try_message_id()
    }

    fn claim_text(&self) -> Result<IdText, KeyProblem> {
        (**self).claim_text()
    }
}

impl<T: MessageId + ?Sized> MessageId for &mut T {
    fn to_message_id(&self) -> Cow<'_, str> {
        (**self).to_message_id()
    }

    fn try_message_id(&self) -> Result<Cow<'_, str>, KeyProblem> {
        (**self).try_message_id()
    }

    fn claim_text(&self) -> Result<IdText, KeyProblem> {
        (**self).claim_text()
    }
}

impl<T: MessageId + ?Sized> MessageId for Box<T> {
    fn to_message_id(&self) -> Cow<'_, str> {
        (**self).to_message_id()
    }

    fn try_message_id(&self) -> Result<Cow<'_, str>, KeyProblem> {
        (**self).try_message_id()
    }

    fn claim_text(&self) -> Result<IdText, KeyProblem> {
        (**self).claim_text()
    }
}

impl<T: MessageId + ?Sized> MessageId for Rc<T> {
    fn to_message_id(&self) -> Cow<'_, str> {
        (**self).to_message_id()
    }

    fn try_message_id(&self) -> Result<Cow<'_, str>, KeyProblem> {
        (**self).try_message_id()
    }

    fn claim_text(&self) -> Result<IdText, KeyProblem> {
        (**self).claim_text()
    }
}

impl<T: MessageId + ?Sized> MessageId for Arc<T> {
    fn to_message_id(&self) -> Cow<'_, str> {
        (**self).to_message_id()
    }

    fn try_message_id(&self) -> Result<Cow<'_, str>, KeyProblem> {
        (**self).try_message_id()
    }

    fn claim_text(&self) -> Result<IdText, KeyProblem> {
        (**self).claim_text()
    }
}

/// `None` is a message without an id: [`KeyProblem::Missing`], which a
/// handler reports as
/// [`InboxError::InvalidMessageId`](crate::InboxError::InvalidMessageId)
/// without running its body. (`to_message_id` of `None` is the empty string,
/// which no claim accepts.)
impl<T: MessageId> MessageId for Option<T> {
    fn to_message_id(&self) -> Cow<'_, str> {
        match self {
            Some(id) => id.to_message_id(),
            None => Cow::Borrowed(""),
        }
    }

    fn try_message_id(&self) -> Result<Cow<'_, str>, KeyProblem> {
        match self {
            Some(id) => id.try_message_id(),
            None => Err(KeyProblem::Missing),
        }
    }
    fn claim_text(&self) -> Result<IdText, KeyProblem> {
        match self {
            Some(id) => id.claim_text(),
            None => Err(KeyProblem::Missing),
        }
    }
}

/// UTF-8 bytes, borrowed as the text they are. Bytes that are not UTF-8
/// are [`KeyProblem::NotUtf8`], never a lossy conversion (which would map
/// different ids to the same text). (`to_message_id` of such bytes is the
/// empty string, which no claim accepts.)
impl MessageId for [u8] {
    fn to_message_id(&self) -> Cow<'_, str> {
        self.try_message_id().unwrap_or(Cow::Borrowed(""))
    }

    fn try_message_id(&self) -> Result<Cow<'_, str>, KeyProblem> {
        std::str::from_utf8(self)
            .map(Cow::Borrowed)
            .map_err(|error| KeyProblem::NotUtf8 {
                valid_up_to: error.valid_up_to(),
            })
    }
}

/// As `[u8]`.
impl MessageId for Vec<u8> {
    fn to_message_id(&self) -> Cow<'_, str> {
        self.as_slice().to_message_id()
    }

    fn try_message_id(&self) -> Result<Cow<'_, str>, KeyProblem> {
        self.as_slice().try_message_id()
    }
}

macro_rules! integer_message_ids {
    ($($int:ty),* $(,)?) => {$(
        impl MessageId for $int {
            fn to_message_id(&self) -> Cow<'_, str> {
                Cow::Owned(self.to_string())
            }

            /// Written into the key, no heap string.
            fn claim_text(&self) -> Result<IdText, KeyProblem> {
                Ok(IdText::display(self))
            }
        }
    )*};
}

integer_message_ids!(
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    std::num::NonZeroU32,
    std::num::NonZeroU64,
    std::num::NonZeroU128,
    std::num::NonZeroUsize,
    std::num::NonZeroI32,
    std::num::NonZeroI64,
);

/// Stored in the hyphenated lowercase form, e.g. `67e55044-10b1-426f-9247-bb680e5fe0c8`.
#[cfg(feature = "uuid")]
impl MessageId for uuid::Uuid {
    fn to_message_id(&self) -> Cow<'_, str> {
        let mut buffer = uuid::Uuid::encode_buffer();
        Cow::Owned(self.hyphenated().encode_lower(&mut buffer).to_owned())
    }

    /// Written into the key, no heap string.
    fn claim_text(&self) -> Result<IdText, KeyProblem> {
        let mut buffer = uuid::Uuid::encode_buffer();
        Ok(IdText::from(Cow::Borrowed(
            &*self.hyphenated().encode_lower(&mut buffer),
        )))
    }
}

/// The AMQP short string, as lapin's `properties.message_id()` returns it
/// (inside an `&Option`); lapin re-exports it as `lapin::types::ShortString`.
#[cfg(feature = "lapin")]
impl MessageId for amq_protocol_types::ShortString {
    fn to_message_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.as_str())
    }
}

/// A NATS header value, such as JetStream's `Nats-Msg-Id`, as
/// `headers.get(async_nats::header::NATS_MESSAGE_ID)` returns it (inside an
/// `Option`).
#[cfg(feature = "async-nats")]
impl MessageId for async_nats::HeaderValue {
    fn to_message_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_borrowed_verbatim() {
        let owned = String::from("Ab c'; DROP TABLE inbox; --");
        assert!(matches!(owned.to_message_id(), Cow::Borrowed(s) if s == owned));
        assert_eq!((&&"x").to_message_id(), "x");
        assert_eq!(Arc::<str>::from("y").to_message_id(), "y");
    }

    #[test]
    fn integers_use_their_decimal_form() {
        assert_eq!((-5_i64).to_message_id(), "-5");
        assert_eq!(u128::MAX.to_message_id(), u128::MAX.to_string());
        assert_eq!(std::num::NonZeroU64::new(9).unwrap().to_message_id(), "9");
    }

    #[test]
    fn claim_text_is_the_message_id_inline_or_not() {
        assert_eq!(
            u128::MAX.claim_text().unwrap().as_str(),
            u128::MAX.to_string()
        );
        assert_eq!(
            i64::MIN.claim_text().unwrap().as_str(),
            i64::MIN.to_string()
        );
        let by_ref: &Option<u8> = &Some(7);
        assert_eq!(
            <&Option<u8> as MessageId>::claim_text(&by_ref)
                .unwrap()
                .as_str(),
            "7"
        );
        let short = "é".repeat(IdText::INLINE_BYTES / 2);
        let long = "x".repeat(IdText::INLINE_BYTES + 1);
        for text in [short.as_str(), long.as_str(), ""] {
            let id = text.claim_text().unwrap();
            assert_eq!(id.as_str(), text);
            assert_eq!(id, IdText::from(Cow::Owned(text.to_owned())));
            assert_eq!(format!("{id:?}"), format!("{text:?}"));
        }
        assert_eq!(None::<u64>.claim_text(), Err(KeyProblem::Missing));
        assert_eq!(
            b"\xff".as_slice().claim_text(),
            Err(KeyProblem::NotUtf8 { valid_up_to: 0 })
        );
    }

    #[test]
    fn options_are_their_content_or_missing() {
        assert_eq!(Some("a").try_message_id().as_deref(), Ok("a"));
        assert_eq!(Some(7_u8).to_message_id(), "7");
        assert_eq!(None::<String>.try_message_id(), Err(KeyProblem::Missing));
        assert_eq!(None::<String>.to_message_id(), "");
        // Through references and smart pointers, the problem is kept.
        let missing: Option<&str> = None;
        assert_eq!(
            <&Option<&str>>::try_message_id(&&missing),
            Err(KeyProblem::Missing)
        );
        assert_eq!(Arc::new(missing).try_message_id(), Err(KeyProblem::Missing));
        assert_eq!(
            Some(Some(b"\xff".as_slice())).try_message_id(),
            Err(KeyProblem::NotUtf8 { valid_up_to: 0 })
        );
    }

    #[test]
    fn bytes_are_borrowed_utf8_or_refused() {
        let bytes = "k-é".as_bytes();
        assert!(matches!(bytes.try_message_id(), Ok(Cow::Borrowed("k-é"))));
        assert_eq!(
            b"k\x80".to_vec().try_message_id(),
            Err(KeyProblem::NotUtf8 { valid_up_to: 1 })
        );
        assert_eq!(b"k\x80".as_slice().to_message_id(), "");
    }

    #[cfg(feature = "lapin")]
    #[test]
    fn amqp_short_strings_are_ids() {
        use amq_protocol_types::ShortString;
        let property: Option<ShortString> = Some(ShortString::from("amqp-1"));
        // What `delivery.properties.message_id()` returns.
        let id: &Option<ShortString> = &property;
        assert!(matches!(id.try_message_id(), Ok(Cow::Borrowed("amqp-1"))));
        let absent: &Option<ShortString> = &None;
        assert_eq!(absent.try_message_id(), Err(KeyProblem::Missing));
    }

    #[cfg(feature = "async-nats")]
    #[test]
    fn nats_header_values_are_ids() {
        use async_nats::header::{HeaderName, NATS_MESSAGE_ID};
        let mut headers = async_nats::HeaderMap::new();
        // Named as the client names a header it parses off the wire.
        let name: HeaderName = "Nats-Msg-Id".parse().unwrap();
        headers.insert(name, "nats-1");
        let headers = Some(headers);
        // What a JetStream consumer reads.
        let id = headers.as_ref().and_then(|h| h.get(NATS_MESSAGE_ID));
        assert_eq!(id.try_message_id().as_deref(), Ok("nats-1"));
        let none: Option<async_nats::HeaderMap> = None;
        let absent = none.as_ref().and_then(|h| h.get(NATS_MESSAGE_ID));
        assert_eq!(absent.try_message_id(), Err(KeyProblem::Missing));
    }

    #[cfg(feature = "uuid")]
    #[test]
    fn uuids_are_hyphenated_lowercase() {
        let id = uuid::Uuid::from_u128(0x67E5_5044_10B1_426F_9247_BB68_0E5F_E0C8);
        assert_eq!(id.to_message_id(), "67e55044-10b1-426f-9247-bb680e5fe0c8");
        assert_eq!(
            id.claim_text().unwrap().as_str(),
            "67e55044-10b1-426f-9247-bb680e5fe0c8"
        );
    }
}
