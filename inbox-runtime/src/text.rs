//! Error text as the inbox keeps it: bounded to what its columns hold
//! ([`MAX_ERROR_TEXT_BYTES`]), without the NUL PostgreSQL cannot store. At
//! the bottom of the runtime, beside the error type that carries such text.

use std::error::Error as StdError;
use std::fmt::{self, Write as _};

/// The most bytes of error text the inbox keeps: a rejection's reason, a
/// failed attempt's error (in `inbox_failures.last_error` and
/// [`InboxError::AttemptsExhausted`](crate::InboxError::AttemptsExhausted)). Longer text is cut at a character
/// boundary and ends with `…`.
///
/// ```
/// let long = "x".repeat(5_000);
/// let rejected = inbox_runtime::InboxError::rejected(&long);
/// let inbox_runtime::InboxError::Rejected { reason } = rejected else { unreachable!() };
/// assert!(reason.len() <= inbox_runtime::MAX_ERROR_TEXT_BYTES);
/// assert!(reason.ends_with('…'));
/// ```
pub const MAX_ERROR_TEXT_BYTES: usize = 1024;

/// `value` as text of at most [`MAX_ERROR_TEXT_BYTES`].
pub(crate) fn error_text(value: &dyn fmt::Display) -> String {
    bounded(value.to_string())
}

/// `error` and its causes, `: `-separated, bounded.
pub(crate) fn error_chain_text(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        if text.len() > MAX_ERROR_TEXT_BYTES {
            break;
        }
        let cause_text = cause.to_string();
        // Wrappers that forward `Display` repeat their source's text.
        if !text.ends_with(&cause_text) {
            let _ = write!(text, ": {cause_text}");
        }
        next = cause.source();
    }
    bounded(text)
}

pub(crate) fn bounded(mut text: String) -> String {
    const ELLIPSIS: &str = "…";
    // PostgreSQL cannot store NUL in text. Replaced before the text is cut:
    // the replacement is three bytes, and the bound is what the columns
    // hold (MySQL's `VARBINARY(1024)` refuses more).
    if text.contains('\0') {
        text = text.replace('\0', "\u{fffd}");
    }
    if text.len() > MAX_ERROR_TEXT_BYTES {
        let mut end = MAX_ERROR_TEXT_BYTES - ELLIPSIS.len();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(ELLIPSIS);
    }
    text
}

/// The text of a panic's payload (a `&str` or a `String`), or a note that
/// it has none.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic with a non-text payload")
}
