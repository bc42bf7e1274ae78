//! Stored results: a handler's result kept with its claim and replayed to
//! later deliveries of the same id (`#[idempotent(store_result)]`), and how
//! a runner answers a duplicate.

use crate::error::{InboxError, StoredResultProblem};
use crate::key::{ClaimKey, preview};
use crate::outcome::OnDuplicate;
#[cfg(feature = "serde")]
use crate::outcome::StoredOutcome;

/// The largest stored result, in bytes of its JSON encoding: 64 KiB. A
/// larger one fails the delivery with [`StoredResultProblem::TooLarge`]
/// (its effects roll back with the claim) rather than being cut.
///
/// ```
/// assert_eq!(inbox_runtime::MAX_STORED_RESULT_BYTES, 65_536);
/// ```
pub const MAX_STORED_RESULT_BYTES: usize = 64 * 1024;

/// A handler result that can be stored with the claim and replayed: what
/// `#[idempotent(store_result)]` needs its `Ok` type to be.
///
/// Implemented (with the `serde` feature) for
/// [`StoredOutcome<T>`](crate::StoredOutcome) where `T` is
/// `serde::Serialize` and `serde::de::DeserializeOwned`: the first delivery
/// returns `StoredOutcome::Processed` and stores `T` as JSON; a later
/// delivery of the same id returns `StoredOutcome::Replayed` with the stored
/// value, or `StoredOutcome::Duplicate` when the claim holds no result (it was made by a
/// handler without `store_result`, or recorded a dead message).
///
/// ```
/// # #[cfg(feature = "serde")] {
/// fn storable<R: inbox_runtime::StoredResult>() {}
/// storable::<inbox_runtime::StoredOutcome<String>>();
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored as the handler's result",
    label = "with `store_result`, the handler returns `Result<inbox_runtime::StoredOutcome<T>, E>`",
    note = "`T` must implement `serde::Serialize` and `serde::de::DeserializeOwned`, and the `serde` feature of `inbox-runtime` must be enabled"
)]
pub trait StoredResult: Sized {
    /// The value to store: the processed value as JSON, `None` when there
    /// is nothing to store.
    #[doc(hidden)]
    fn to_stored(&self, key: &ClaimKey) -> Result<Option<Vec<u8>>, InboxError>;

    /// The answer to a duplicate delivery, from the result its claim holds.
    #[doc(hidden)]
    fn from_stored(key: &ClaimKey, stored: Option<&[u8]>) -> Result<Self, InboxError>;
}

#[cfg(feature = "serde")]
impl<T> StoredResult for StoredOutcome<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    fn to_stored(&self, key: &ClaimKey) -> Result<Option<Vec<u8>>, InboxError> {
        let value = match self {
            StoredOutcome::Processed(value) | StoredOutcome::Replayed(value) => value,
            StoredOutcome::Duplicate => return Ok(None),
        };
        let json = serde_json::to_vec(value).map_err(|error| {
            problem(
                key,
                StoredResultProblem::Unencodable {
                    reason: crate::text::error_text(&error),
                },
            )
        })?;
        if json.len() > MAX_STORED_RESULT_BYTES {
            return Err(problem(
                key,
                StoredResultProblem::TooLarge {
                    bytes: json.len(),
                    max_bytes: MAX_STORED_RESULT_BYTES,
                },
            ));
        }
        Ok(Some(json))
    }

    fn from_stored(key: &ClaimKey, stored: Option<&[u8]>) -> Result<Self, InboxError> {
        let Some(json) = stored else {
            return Ok(StoredOutcome::Duplicate);
        };
        serde_json::from_slice(json)
            .map(StoredOutcome::Replayed)
            .map_err(|error| {
                problem(
                    key,
                    StoredResultProblem::Unreadable {
                        reason: crate::text::error_text(&error),
                    },
                )
            })
    }
}

#[cfg_attr(not(feature = "serde"), allow(dead_code))]
fn problem(key: &ClaimKey, problem: StoredResultProblem) -> InboxError {
    InboxError::StoredResult {
        handler: key.handler().as_str().to_owned(),
        message_id: preview(key.message_id()),
        problem,
    }
}

/// How a runner answers a duplicate and what it stores after the body: the
/// plain runners ([`Plain`]) or the storing ones ([`Storing`]).
pub trait Reply<R> {
    /// Whether a duplicate's stored result is read, and the body's result
    /// stored.
    const STORES: bool;

    /// The answer to a duplicate delivery.
    fn duplicate(key: &ClaimKey, stored: Option<&[u8]>) -> Result<R, InboxError>;

    /// What to store after the body returned `value`.
    fn to_store(key: &ClaimKey, value: &R) -> Result<Option<Vec<u8>>, InboxError>;
}

/// What the body's `Ok` value stores ([`Reply::to_store`]), encoded under
/// the same watch as the body: a panic of the value's `Serialize` is the
/// delivery's panic, returned as the body's would be (`Err`), so the runner
/// rolls the level back, counts the attempt and resumes it instead of
/// unwinding past an open transaction.
pub(crate) type Encoded = Result<Option<Vec<u8>>, InboxError>;

/// [`Reply::to_store`] of `value`, its panic caught (see [`Encoded`]).
pub(crate) fn encode_caught<P: Reply<R>, R>(
    key: &ClaimKey,
    value: &R,
) -> std::thread::Result<Encoded> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| P::to_store(key, value)))
}

/// A handler without `store_result`: a duplicate is `R::on_duplicate()`.
#[derive(Debug)]
pub struct Plain;

impl<R: OnDuplicate> Reply<R> for Plain {
    const STORES: bool = false;

    fn duplicate(_key: &ClaimKey, _stored: Option<&[u8]>) -> Result<R, InboxError> {
        Ok(R::on_duplicate())
    }

    fn to_store(_key: &ClaimKey, _value: &R) -> Result<Option<Vec<u8>>, InboxError> {
        Ok(None)
    }
}

/// A handler with `store_result`.
#[derive(Debug)]
pub struct Storing;

impl<R: StoredResult> Reply<R> for Storing {
    const STORES: bool = true;

    fn duplicate(key: &ClaimKey, stored: Option<&[u8]>) -> Result<R, InboxError> {
        R::from_stored(key, stored)
    }

    fn to_store(key: &ClaimKey, value: &R) -> Result<Option<Vec<u8>>, InboxError> {
        value.to_stored(key)
    }
}
