//! The canonical encoding of a `serde::Serialize` value (feature `serde`):
//! a serializer that writes the encoding the [module documentation](super)
//! specifies, whatever order a map iterates in.

use std::fmt;

use serde::ser::{self, Serialize};

use super::{BYTES, ENCODING_VERSION, Fingerprint, TEXT};

const NULL: u8 = b'n';
const TRUE: u8 = b't';
const FALSE: u8 = b'f';
const INTEGER: u8 = b'i';
const LARGE_UNSIGNED: u8 = b'u';
const FLOAT: u8 = b'd';
const SEQUENCE: u8 = b'a';
const MAP: u8 = b'm';

/// The fingerprint of `value`'s canonical encoding, or why its `Serialize`
/// implementation refused to be encoded.
pub(super) fn fingerprint<T: Serialize + ?Sized>(value: &T) -> Result<Fingerprint, EncodeError> {
    let mut encoding = vec![ENCODING_VERSION];
    value.serialize(Encoder::new(&mut encoding))?;
    Ok(Fingerprint::of_encoding(&encoding))
}

/// A `Serialize` implementation failed (its own error, passed on).
#[derive(Debug)]
pub(crate) struct EncodeError(Box<str>);

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EncodeError {}

impl ser::Error for EncodeError {
    fn custom<M: fmt::Display>(message: M) -> Self {
        EncodeError(message.to_string().into_boxed_str())
    }
}

fn push_len(out: &mut Vec<u8>, len: usize) {
    out.extend_from_slice(&(len as u64).to_be_bytes());
}

fn push_tagged(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    push_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

fn push_integer(out: &mut Vec<u8>, value: i128) {
    out.push(INTEGER);
    out.extend_from_slice(&value.to_be_bytes());
}

/// Encodes one value into `out`.
struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    /// For a sequence's element: where an integer from 0 to 255 goes
    /// instead of `out` (a sequence of only those is encoded as bytes, and
    /// a long one should not pay for 17 bytes of encoding per byte).
    byte: Option<&'a mut Option<u8>>,
}

impl<'a> Encoder<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        Encoder { out, byte: None }
    }
}

fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    value.serialize(Encoder::new(&mut out))?;
    Ok(out)
}

/// The most a sequence reserves for its bytes before its first element:
/// a `Serialize` implementation's length is only a hint.
const RESERVED_BYTES: usize = 1 << 20;

/// A sequence being encoded: its bytes while every element is a byte, the
/// elements' encodings once one is not.
#[derive(Default)]
struct SequenceState {
    bytes: Option<Vec<u8>>,
    elements: Vec<u8>,
    count: usize,
    /// The element being encoded (one buffer for all, so a long sequence
    /// of bytes allocates nothing per element).
    scratch: Vec<u8>,
}

impl SequenceState {
    fn new() -> Self {
        SequenceState::with_len(None)
    }

    /// A sequence of `len` elements, as its `Serialize` says: room for that
    /// many bytes (up to [`RESERVED_BYTES`]), so that a long payload of
    /// bytes grows its buffer once.
    fn with_len(len: Option<usize>) -> Self {
        SequenceState {
            bytes: Some(Vec::with_capacity(len.unwrap_or(0).min(RESERVED_BYTES))),
            ..SequenceState::default()
        }
    }

    #[inline]
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        self.scratch.clear();
        let mut byte = None;
        value.serialize(Encoder {
            out: &mut self.scratch,
            byte: Some(&mut byte),
        })?;
        self.count += 1;
        match (&mut self.bytes, byte) {
            (Some(bytes), Some(byte)) => bytes.push(byte),
            (None, Some(byte)) => push_integer(&mut self.elements, i128::from(byte)),
            (Some(bytes), None) => {
                for byte in std::mem::take(bytes) {
                    push_integer(&mut self.elements, i128::from(byte));
                }
                self.bytes = None;
                self.elements.extend_from_slice(&self.scratch);
            }
            (None, None) => self.elements.extend_from_slice(&self.scratch),
        }
        Ok(())
    }

    fn end(self, out: &mut Vec<u8>) {
        match self.bytes {
            Some(bytes) => push_tagged(out, BYTES, &bytes),
            None => {
                out.push(SEQUENCE);
                push_len(out, self.count);
                out.extend_from_slice(&self.elements);
            }
        }
    }
}

/// A map or struct being encoded: entries sorted by their key's encoding
/// at the end.
#[derive(Default)]
struct MapState {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    key: Option<Vec<u8>>,
}

impl MapState {
    fn entry<V: Serialize + ?Sized>(&mut self, key: Vec<u8>, value: &V) -> Result<(), EncodeError> {
        self.entries.push((key, encode(value)?));
        Ok(())
    }

    fn end(mut self, out: &mut Vec<u8>) {
        self.entries.sort();
        out.push(MAP);
        push_len(out, self.entries.len());
        for (key, value) in self.entries {
            out.extend_from_slice(&key);
            out.extend_from_slice(&value);
        }
    }
}

fn text_encoding(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 9);
    push_tagged(&mut out, TEXT, text.as_bytes());
    out
}

/// A variant with content: a one-entry map from its name to the content.
fn push_variant(out: &mut Vec<u8>, name: &str, content: &[u8]) {
    out.push(MAP);
    push_len(out, 1);
    out.extend_from_slice(&text_encoding(name));
    out.extend_from_slice(content);
}

/// A sequence, tuple or tuple struct.
struct Sequence<'a> {
    out: &'a mut Vec<u8>,
    state: SequenceState,
}

/// A tuple variant: its name and its content as a sequence.
struct TupleVariant<'a> {
    out: &'a mut Vec<u8>,
    name: &'static str,
    state: SequenceState,
}

/// A map or struct.
struct Map<'a> {
    out: &'a mut Vec<u8>,
    state: MapState,
}

/// A struct variant: its name and its content as a map.
struct StructVariant<'a> {
    out: &'a mut Vec<u8>,
    name: &'static str,
    state: MapState,
}

impl ser::SerializeSeq for Sequence<'_> {
    type Ok = ();
    type Error = EncodeError;

    #[inline]
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        self.state.element(value)
    }

    fn end(self) -> Result<(), EncodeError> {
        self.state.end(self.out);
        Ok(())
    }
}

impl ser::SerializeTuple for Sequence<'_> {
    type Ok = ();
    type Error = EncodeError;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        self.state.element(value)
    }

    fn end(self) -> Result<(), EncodeError> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleStruct for Sequence<'_> {
    type Ok = ();
    type Error = EncodeError;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        self.state.element(value)
    }

    fn end(self) -> Result<(), EncodeError> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleVariant for TupleVariant<'_> {
    type Ok = ();
    type Error = EncodeError;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        self.state.element(value)
    }

    fn end(self) -> Result<(), EncodeError> {
        let mut content = Vec::new();
        self.state.end(&mut content);
        push_variant(self.out, self.name, &content);
        Ok(())
    }
}

impl ser::SerializeMap for Map<'_> {
    type Ok = ();
    type Error = EncodeError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), EncodeError> {
        self.state.key = Some(encode(key)?);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        let key =
            self.state.key.take().ok_or_else(|| {
                <EncodeError as ser::Error>::custom("a map value without its key")
            })?;
        self.state.entry(key, value)
    }

    fn end(self) -> Result<(), EncodeError> {
        self.state.end(self.out);
        Ok(())
    }
}

impl ser::SerializeStruct for Map<'_> {
    type Ok = ();
    type Error = EncodeError;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), EncodeError> {
        self.state.entry(text_encoding(name), value)
    }

    fn end(self) -> Result<(), EncodeError> {
        self.state.end(self.out);
        Ok(())
    }
}

impl ser::SerializeStructVariant for StructVariant<'_> {
    type Ok = ();
    type Error = EncodeError;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), EncodeError> {
        self.state.entry(text_encoding(name), value)
    }

    fn end(self) -> Result<(), EncodeError> {
        let mut content = Vec::new();
        self.state.end(&mut content);
        push_variant(self.out, self.name, &content);
        Ok(())
    }
}

impl<'a> ser::Serializer for Encoder<'a> {
    type Ok = ();
    type Error = EncodeError;
    type SerializeSeq = Sequence<'a>;
    type SerializeTuple = Sequence<'a>;
    type SerializeTupleStruct = Sequence<'a>;
    type SerializeTupleVariant = TupleVariant<'a>;
    type SerializeMap = Map<'a>;
    type SerializeStruct = Map<'a>;
    type SerializeStructVariant = StructVariant<'a>;

    fn serialize_bool(self, value: bool) -> Result<(), EncodeError> {
        self.out.push(if value { TRUE } else { FALSE });
        Ok(())
    }

    fn serialize_i8(self, value: i8) -> Result<(), EncodeError> {
        self.serialize_i128(value.into())
    }

    fn serialize_i16(self, value: i16) -> Result<(), EncodeError> {
        self.serialize_i128(value.into())
    }

    fn serialize_i32(self, value: i32) -> Result<(), EncodeError> {
        self.serialize_i128(value.into())
    }

    fn serialize_i64(self, value: i64) -> Result<(), EncodeError> {
        self.serialize_i128(value.into())
    }

    #[inline]
    fn serialize_i128(self, value: i128) -> Result<(), EncodeError> {
        match (self.byte, u8::try_from(value)) {
            (Some(slot), Ok(byte)) => *slot = Some(byte),
            _ => push_integer(self.out, value),
        }
        Ok(())
    }

    #[inline]
    fn serialize_u8(self, value: u8) -> Result<(), EncodeError> {
        self.serialize_i128(value.into())
    }

    fn serialize_u16(self, value: u16) -> Result<(), EncodeError> {
        self.serialize_i128(value.into())
    }

    fn serialize_u32(self, value: u32) -> Result<(), EncodeError> {
        self.serialize_i128(value.into())
    }

    fn serialize_u64(self, value: u64) -> Result<(), EncodeError> {
        self.serialize_i128(value.into())
    }

    fn serialize_u128(self, value: u128) -> Result<(), EncodeError> {
        match i128::try_from(value) {
            Ok(value) => self.serialize_i128(value),
            Err(_) => {
                self.out.push(LARGE_UNSIGNED);
                self.out.extend_from_slice(&value.to_be_bytes());
                Ok(())
            }
        }
    }

    fn serialize_f32(self, value: f32) -> Result<(), EncodeError> {
        self.serialize_f64(value.into())
    }

    fn serialize_f64(self, value: f64) -> Result<(), EncodeError> {
        let value = if value.is_nan() { f64::NAN } else { value };
        self.out.push(FLOAT);
        self.out.extend_from_slice(&value.to_bits().to_be_bytes());
        Ok(())
    }

    fn serialize_char(self, value: char) -> Result<(), EncodeError> {
        self.serialize_str(value.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, value: &str) -> Result<(), EncodeError> {
        push_tagged(self.out, TEXT, value.as_bytes());
        Ok(())
    }

    fn serialize_bytes(self, value: &[u8]) -> Result<(), EncodeError> {
        push_tagged(self.out, BYTES, value);
        Ok(())
    }

    fn serialize_none(self) -> Result<(), EncodeError> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), EncodeError> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), EncodeError> {
        self.out.push(NULL);
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), EncodeError> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), EncodeError> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), EncodeError> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), EncodeError> {
        push_variant(self.out, variant, &encode(value)?);
        Ok(())
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Sequence<'a>, EncodeError> {
        Ok(Sequence {
            out: self.out,
            state: SequenceState::with_len(len),
        })
    }

    fn serialize_tuple(self, _len: usize) -> Result<Sequence<'a>, EncodeError> {
        Ok(Sequence {
            out: self.out,
            state: SequenceState::new(),
        })
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Sequence<'a>, EncodeError> {
        Ok(Sequence {
            out: self.out,
            state: SequenceState::new(),
        })
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<TupleVariant<'a>, EncodeError> {
        Ok(TupleVariant {
            out: self.out,
            name: variant,
            state: SequenceState::new(),
        })
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Map<'a>, EncodeError> {
        Ok(Map {
            out: self.out,
            state: MapState::default(),
        })
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Map<'a>, EncodeError> {
        Ok(Map {
            out: self.out,
            state: MapState::default(),
        })
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<StructVariant<'a>, EncodeError> {
        Ok(StructVariant {
            out: self.out,
            name: variant,
            state: MapState::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use serde::Serialize;

    use super::*;
    use crate::fingerprint::Fingerprint;

    fn of<T: Serialize + ?Sized>(value: &T) -> Fingerprint {
        fingerprint(value).expect("encodable")
    }

    #[test]
    fn text_and_bytes_hash_as_without_the_serde_feature() {
        let text = Fingerprint::of_tagged(TEXT, b"hello");
        assert_eq!(of("hello"), text);
        assert_eq!(of(&String::from("hello")), text);
        assert_eq!(of(&'h'), Fingerprint::of_tagged(TEXT, b"h"));
        let bytes = Fingerprint::of_tagged(BYTES, b"hello");
        assert_eq!(of(&b"hello"[..]), bytes);
        assert_eq!(of(&b"hello".to_vec()), bytes);
        assert_eq!(of(&Box::new(b"hello".to_vec())), bytes);
        struct Raw;
        impl Serialize for Raw {
            fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_bytes(b"hello")
            }
        }
        assert_eq!(of(&Raw), bytes);
        assert_eq!(of(&Vec::<u8>::new()), Fingerprint::of_tagged(BYTES, b""));
    }

    #[derive(Serialize)]
    struct Payment {
        id: u64,
        amount: i32,
        currency: &'static str,
        tags: Vec<&'static str>,
        note: Option<String>,
    }

    #[derive(Serialize)]
    enum Event {
        Paid(Payment),
        Cancelled,
        Moved { from: u8, to: u8 },
    }

    fn payment() -> Payment {
        Payment {
            id: 7,
            amount: -250,
            currency: "EUR",
            tags: vec!["a", "b"],
            note: None,
        }
    }

    #[test]
    fn the_encoding_is_pinned() {
        // Computed apart from this code, by a transcription of the module
        // documentation's table into a few lines of Python (hashlib). A
        // change here breaks every stored fingerprint: a new encoding needs
        // a new version byte instead.
        assert_eq!(
            of(&payment()).to_hex(),
            "f608cf78bfc0a423bfcce542b2fabc3fcdd1548dd7a495e9795d2a3f7267857f"
        );
        assert_eq!(
            of(&Event::Paid(payment())).to_hex(),
            "a53df181040cf5acc398292d8b2a5bc56e4e21939bf503d00039f8e7a49e8396"
        );
    }

    #[test]
    fn the_encoding_follows_the_documented_table() {
        let mut expected = vec![ENCODING_VERSION, MAP];
        expected.extend_from_slice(&2_u64.to_be_bytes());
        let mut entry = |key: &str, value: &[u8]| {
            expected.extend_from_slice(&text_encoding(key));
            expected.extend_from_slice(value);
        };
        let mut integer = vec![INTEGER];
        integer.extend_from_slice(&(-3_i128).to_be_bytes());
        entry("a", &integer);
        let mut sequence = vec![SEQUENCE];
        sequence.extend_from_slice(&2_u64.to_be_bytes());
        sequence.push(TRUE);
        sequence.push(NULL);
        entry("b", &sequence);
        #[derive(Serialize)]
        struct Two {
            b: (bool, ()),
            a: i8,
        }
        assert_eq!(
            of(&Two {
                b: (true, ()),
                a: -3
            }),
            Fingerprint::of_encoding(&expected)
        );
    }

    #[test]
    fn maps_hash_alike_whatever_their_order() {
        let forward: HashMap<String, u32> = (0..50).map(|n| (format!("k{n}"), n)).collect();
        let mut backward: HashMap<String, u32> = HashMap::new();
        for n in (0..50).rev() {
            backward.insert(format!("k{n}"), n);
        }
        let sorted: BTreeMap<String, u32> = forward.clone().into_iter().collect();
        assert_eq!(of(&forward), of(&backward));
        assert_eq!(of(&forward), of(&sorted));
        backward.insert("k0".into(), 1);
        assert_ne!(of(&forward), of(&backward));
    }

    #[test]
    fn values_that_differ_hash_differently() {
        let distinct = [
            of(&1_u8),
            of(&1.0_f64),
            of("1"),
            of(&true),
            of(&()),
            of(&vec![1_u16, 300]),
            of(&vec![1_u16, 30]),
            of(&Event::Cancelled),
            of(&Event::Moved { from: 1, to: 2 }),
            of(&Event::Moved { from: 2, to: 1 }),
            of(&u128::MAX),
        ];
        for (i, a) in distinct.iter().enumerate() {
            for b in &distinct[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // Integers of any width are the same integer; bytes and small
        // integer sequences are the same sequence.
        assert_eq!(of(&1_u8), of(&1_i64));
        assert_eq!(of(&vec![1_u16, 30]), of(&b"\x01\x1e"[..]));
        assert_eq!(of(&Event::Cancelled), of("Cancelled"));
        assert_eq!(of(&f64::NAN), of(&-f64::NAN));
        assert_eq!(of(&Some(5)), of(&5));
    }

    #[test]
    fn a_sequence_s_length_is_only_a_hint() {
        // A `Serialize` that promises more elements than it gives, or
        // fewer: the encoding counts what it gave, and a promise of
        // `usize::MAX` reserves a bounded buffer, not that.
        struct Promising(Option<usize>, Vec<u16>);
        impl Serialize for Promising {
            fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeSeq;
                let mut seq = serializer.serialize_seq(self.0)?;
                for element in &self.1 {
                    seq.serialize_element(element)?;
                }
                seq.end()
            }
        }
        let bytes: Vec<u16> = (0..5000).map(|n| n % 256).collect();
        for hint in [None, Some(0), Some(3), Some(usize::MAX)] {
            assert_eq!(
                of(&Promising(hint, bytes.clone())),
                Fingerprint::of_tagged(BYTES, &bytes.iter().map(|&b| b as u8).collect::<Vec<_>>())
            );
        }
        // Bytes, then an element that is not one: a sequence of integers.
        let mut mixed = bytes.clone();
        mixed.push(256);
        let mut expected = vec![ENCODING_VERSION, SEQUENCE];
        expected.extend_from_slice(&(mixed.len() as u64).to_be_bytes());
        for &element in &mixed {
            expected.push(INTEGER);
            expected.extend_from_slice(&i128::from(element).to_be_bytes());
        }
        let expected = Fingerprint::of_encoding(&expected);
        assert_eq!(of(&Promising(Some(usize::MAX), mixed.clone())), expected);
        assert_eq!(of(&mixed), expected);
    }

    #[test]
    fn a_failing_serialize_is_an_error() {
        struct Broken;
        impl Serialize for Broken {
            fn serialize<S: ser::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(ser::Error::custom("the value is poisoned"))
            }
        }
        let error = crate::Fingerprint::of(&Broken).unwrap_err();
        assert!(
            matches!(&error, crate::InboxError::InvalidFingerprint { reason } if reason == "the value is poisoned"),
            "{error:?}"
        );
        assert!(!error.is_retryable());
    }
}
