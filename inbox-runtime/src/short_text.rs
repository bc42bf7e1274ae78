//! Short statement texts written for every delivery (a transaction's begin
//! with its idle bound, a savepoint) without a heap allocation: kept inline
//! when they fit, in a `String` when they do not.

use std::fmt;
use std::ops::Deref;

/// The most bytes a [`ShortText`] keeps inline: every begin the backends
/// write (with an idle bound and what is sent after it) fits.
const INLINE_BYTES: usize = 256;

/// A text assembled from pieces, a `&'static str` as it is, inline up to
/// [`INLINE_BYTES`] and in a `String` beyond.
#[derive(Clone)]
pub(crate) struct ShortText(Repr);

#[derive(Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "the inline bytes are the point: boxed, they would be the allocation this type avoids"
)]
enum Repr {
    Static(&'static str),
    /// Whole `&str` pieces, one after the other: valid UTF-8 up to `len`.
    Inline {
        bytes: [u8; INLINE_BYTES],
        len: usize,
    },
    Heap(String),
}

impl ShortText {
    /// An empty text, to be written to.
    pub(crate) fn new() -> Self {
        ShortText(Repr::Inline {
            bytes: [0; INLINE_BYTES],
            len: 0,
        })
    }

    /// `text` as it is, copied nowhere.
    pub(crate) fn from_static(text: &'static str) -> Self {
        ShortText(Repr::Static(text))
    }

    /// Appends `piece`, moving the text to the heap once it no longer fits.
    pub(crate) fn push_str(&mut self, piece: &str) {
        match &mut self.0 {
            Repr::Inline { bytes, len } if *len + piece.len() <= INLINE_BYTES => {
                bytes[*len..*len + piece.len()].copy_from_slice(piece.as_bytes());
                *len += piece.len();
            }
            Repr::Heap(text) => text.push_str(piece),
            Repr::Static(text) if text.len() + piece.len() <= INLINE_BYTES => {
                let text = *text;
                *self = ShortText::new();
                self.push_str(text);
                self.push_str(piece);
            }
            _ => {
                let mut text = String::with_capacity(self.len() + piece.len());
                text.push_str(self);
                text.push_str(piece);
                self.0 = Repr::Heap(text);
            }
        }
    }

    /// The text.
    pub(crate) fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Static(text) => text,
            Repr::Inline { bytes, len } => inline_str(&bytes[..*len]),
            Repr::Heap(text) => text,
        }
    }

    /// Whether the text is on the heap (for the tests of the bound).
    #[cfg(test)]
    pub(crate) fn is_on_heap(&self) -> bool {
        matches!(self.0, Repr::Heap(_))
    }
}

/// The inline bytes as text. They are whole `&str` pieces, so valid UTF-8;
/// were they not, the valid start is what is given.
fn inline_str(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(error) => std::str::from_utf8(&bytes[..error.valid_up_to()]).unwrap_or_default(),
    }
}

impl Deref for ShortText {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Write for ShortText {
    fn write_str(&mut self, piece: &str) -> fmt::Result {
        self.push_str(piece);
        Ok(())
    }
}

impl fmt::Debug for ShortText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ShortText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl PartialEq for ShortText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<str> for ShortText {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ShortText {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for ShortText {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::{INLINE_BYTES, ShortText};

    #[test]
    fn pieces_up_to_the_bound_stay_inline_and_longer_text_moves_whole() {
        let mut text = ShortText::new();
        text.push_str("SET x = ");
        write!(text, "{}", 12_345).unwrap();
        text.push_str("; é");
        assert_eq!(text, "SET x = 12345; é");
        assert!(!text.is_on_heap());

        let piece = "y".repeat(INLINE_BYTES - text.len());
        text.push_str(&piece);
        assert_eq!(text.len(), INLINE_BYTES);
        assert!(!text.is_on_heap());

        text.push_str("ü and on");
        assert!(text.is_on_heap());
        assert_eq!(text, format!("SET x = 12345; é{piece}ü and on"));
        text.push_str(".");
        assert!(text.ends_with("on."));
    }

    #[test]
    fn a_piece_longer_than_the_bound_goes_to_the_heap_at_once() {
        let long = "z".repeat(INLINE_BYTES + 1);
        let mut text = ShortText::new();
        text.push_str(&long);
        assert!(text.is_on_heap());
        assert_eq!(text, long);
    }

    #[test]
    fn static_text_is_kept_as_it_is_and_extended_inline() {
        let mut text = ShortText::from_static("BEGIN");
        assert_eq!(text, "BEGIN");
        text.push_str("; SET y = 1");
        assert_eq!(text, "BEGIN; SET y = 1");
        assert!(!text.is_on_heap());
        text.push_str(&"z".repeat(INLINE_BYTES));
        assert!(text.is_on_heap());
        assert!(text.starts_with("BEGIN; SET y = 1z"));
    }
}
