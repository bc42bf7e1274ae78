//! Types that can serve as a producer-assigned message id.

use std::borrow::Cow;
use std::rc::Rc;
use std::sync::Arc;

/// A value that identifies one message, assigned by its producer.
///
/// The inbox stores ids as text. This trait is implemented for strings,
/// integers, [`uuid::Uuid`] (with the `uuid` feature) and references or
/// smart pointers to them. Floats, `bool`, `char` and structs are not ids:
/// implement `MessageId` for a newtype of your own if your envelope carries a
/// composite key, and make the text stable across releases, since it is what
/// deduplicates redeliveries.
///
/// ```
/// use inbox_runtime::MessageId;
///
/// assert_eq!("order-17".to_message_id(), "order-17");
/// assert_eq!(42_u64.to_message_id(), "42");
///
/// struct Offset { partition: u32, offset: u64 }
/// impl MessageId for Offset {
///     fn to_message_id(&self) -> std::borrow::Cow<'_, str> {
///         format!("{}:{}", self.partition, self.offset).into()
///     }
/// }
/// assert_eq!(Offset { partition: 3, offset: 9 }.to_message_id(), "3:9");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot serve as a message id",
    label = "this id expression has type `{Self}`",
    note = "a message id is the producer's stable id as a string, an integer or a `uuid::Uuid` (feature `uuid`); implement `inbox_runtime::MessageId` for an id type of your own"
)]
pub trait MessageId {
    /// The id as the text stored in the inbox.
    fn to_message_id(&self) -> Cow<'_, str>;
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
}

impl<T: MessageId + ?Sized> MessageId for &mut T {
    fn to_message_id(&self) -> Cow<'_, str> {
        (**self).to_message_id()
    }
}

impl<T: MessageId + ?Sized> MessageId for Box<T> {
    fn to_message_id(&self) -> Cow<'_, str> {
        (**self).to_message_id()
    }
}

impl<T: MessageId + ?Sized> MessageId for Rc<T> {
    fn to_message_id(&self) -> Cow<'_, str> {
        (**self).to_message_id()
    }
}

impl<T: MessageId + ?Sized> MessageId for Arc<T> {
    fn to_message_id(&self) -> Cow<'_, str> {
        (**self).to_message_id()
    }
}

macro_rules! integer_message_ids {
    ($($int:ty),* $(,)?) => {$(
        impl MessageId for $int {
            fn to_message_id(&self) -> Cow<'_, str> {
                Cow::Owned(self.to_string())
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

    #[cfg(feature = "uuid")]
    #[test]
    fn uuids_are_hyphenated_lowercase() {
        let id = uuid::Uuid::from_u128(0x67E5_5044_10B1_426F_9247_BB68_0E5F_E0C8);
        assert_eq!(id.to_message_id(), "67e55044-10b1-426f-9247-bb680e5fe0c8");
    }
}
