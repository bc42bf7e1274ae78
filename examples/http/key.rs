//! Reading the `Idempotency-Key` request header.
//!
//! The IETF draft makes the field's value a Structured Field String
//! (RFC 9651: `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`);
//! most services, Stripe's included, send the bare value
//! (`Idempotency-Key: 8e03978e-…`). Both are accepted, and name the same
//! key: a quoted value is unquoted (`\"` and `\\` unescaped), any other is
//! taken as it is. Its length and content are then the inbox's to check: an
//! empty key, or one longer than the 255 bytes the inbox stores, is
//! `InboxError::InvalidMessageId`.

use axum::http::HeaderMap;

/// The header's name.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Why a request carries no usable `Idempotency-Key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The header is absent.
    Missing,
    /// The header is present more than once.
    Repeated,
    /// The value is not printable ASCII, or a quoted value is not a valid
    /// Structured Field String.
    Malformed(&'static str),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::Missing => f.write_str(
                "this operation requires an `Idempotency-Key` header: send a unique key \
                 (a UUID) with the request, and the same key with each retry of it",
            ),
            KeyError::Repeated => f.write_str("the `Idempotency-Key` header is repeated"),
            KeyError::Malformed(why) => {
                write!(f, "the `Idempotency-Key` header is malformed: {why}")
            }
        }
    }
}

/// The request's idempotency key.
///
/// ```
/// use axum::http::{HeaderMap, HeaderValue};
/// use inbox_examples::http::key::{idempotency_key, KeyError};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(idempotency_key(&headers), Err(KeyError::Missing));
/// headers.insert("idempotency-key", HeaderValue::from_static("\"pay-1\""));
/// assert_eq!(idempotency_key(&headers).unwrap(), "pay-1");
/// headers.insert("idempotency-key", HeaderValue::from_static("pay-1"));
/// assert_eq!(idempotency_key(&headers).unwrap(), "pay-1");
/// ```
pub fn idempotency_key(headers: &HeaderMap) -> Result<String, KeyError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(KeyError::Missing)?;
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    let text = value
        .to_str()
        .map_err(|_| KeyError::Malformed("it is not printable ASCII"))?;
    match text.strip_prefix('"') {
        Some(quoted) => unquote(quoted),
        None => Ok(text.to_owned()),
    }
}

/// The content of a Structured Field String, after its opening quote.
fn unquote(rest: &str) -> Result<String, KeyError> {
    let mut key = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' if chars.as_str().is_empty() => return Ok(key),
            '"' => return Err(KeyError::Malformed("text after the closing quote")),
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => key.push(escaped),
                _ => {
                    return Err(KeyError::Malformed(
                        "a backslash escapes only `\"` and `\\`",
                    ))
                }
            },
            ' '..='~' => key.push(c),
            _ => return Err(KeyError::Malformed("a control character in a quoted key")),
        }
    }
    Err(KeyError::Malformed("the quoted key has no closing quote"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn key(value: &[u8]) -> Result<String, KeyError> {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_bytes(value).unwrap());
        idempotency_key(&headers)
    }

    #[test]
    fn quoted_and_bare_keys_are_the_same_key() {
        assert_eq!(key(b"abc").unwrap(), "abc");
        assert_eq!(key(b"\"abc\"").unwrap(), "abc");
        assert_eq!(key(br#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(key(b"\"\"").unwrap(), "", "empty: the inbox refuses it");
    }

    #[test]
    fn malformed_keys_are_refused() {
        assert!(matches!(key(b"\"abc"), Err(KeyError::Malformed(_))));
        assert!(matches!(key(b"\"a\"b\""), Err(KeyError::Malformed(_))));
        assert!(matches!(key(br#""a\nb""#), Err(KeyError::Malformed(_))));
        assert!(matches!(key(b"caf\xc3\xa9"), Err(KeyError::Malformed(_))));
        let mut headers = HeaderMap::new();
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("b"));
        assert_eq!(idempotency_key(&headers), Err(KeyError::Repeated));
    }
}
