//! What a handler returns, and what it returns when a delivery is a duplicate.

/// The result of an idempotent handler that wants to know whether its body ran.
///
/// Return `Result<Outcome<T>, E>` from a handler to tell a first delivery
/// ([`Outcome::Processed`]) apart from a redelivery whose id was already
/// claimed ([`Outcome::Duplicate`]): the body only runs for the former.
///
/// ```
/// use inbox_runtime::Outcome;
///
/// let first: Outcome<u32> = Outcome::Processed(7);
/// let again: Outcome<u32> = Outcome::Duplicate;
/// assert!(first.is_processed());
/// assert!(again.is_duplicate());
/// assert_eq!(first.processed(), Some(7));
/// // `From<T>` lets a body finish with `Ok(value.into())`.
/// assert_eq!(Outcome::from(3), Outcome::Processed(3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "an `Outcome` tells whether the message was processed or skipped as a duplicate"]
pub enum Outcome<T> {
    /// The message id was claimed now and the body ran, producing this value.
    Processed(T),
    /// The message id had already been claimed: the body did not run.
    Duplicate,
}

impl<T> Outcome<T> {
    /// `true` when the body ran.
    ///
    /// ```
    /// assert!(inbox_runtime::Outcome::Processed(()).is_processed());
    /// ```
    pub fn is_processed(&self) -> bool {
        matches!(self, Outcome::Processed(_))
    }

    /// `true` when the delivery was a duplicate and the body was skipped.
    ///
    /// ```
    /// assert!(inbox_runtime::Outcome::<()>::Duplicate.is_duplicate());
    /// ```
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate)
    }

    /// The body's value, or `None` for a duplicate.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::Outcome::Processed(5).processed(), Some(5));
    /// ```
    pub fn processed(self) -> Option<T> {
        match self {
            Outcome::Processed(value) => Some(value),
            Outcome::Duplicate => None,
        }
    }

    /// Maps the processed value, keeping a duplicate a duplicate.
    ///
    /// ```
    /// use inbox_runtime::Outcome;
    /// assert_eq!(Outcome::Processed(2).map(|n| n * 10), Outcome::Processed(20));
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Processed(value) => Outcome::Processed(f(value)),
            Outcome::Duplicate => Outcome::Duplicate,
        }
    }
}

impl<T> From<T> for Outcome<T> {
    fn from(value: T) -> Self {
        Outcome::Processed(value)
    }
}

/// The result of a handler declared with `store_result`, whose duplicates
/// return what the first delivery returned.
///
/// A separate type from [`Outcome`], which a handler without `store_result`
/// returns: only a storing handler can replay, so only its callers handle
/// [`Replayed`](StoredOutcome::Replayed). See
/// [`StoredResult`](crate::StoredResult) for what is stored.
///
/// ```
/// use inbox_runtime::StoredOutcome;
///
/// let first = StoredOutcome::Processed("receipt-7");
/// let retry = StoredOutcome::Replayed("receipt-7");
/// assert!(first.is_processed() && retry.is_replayed());
/// assert_eq!(first.value(), retry.value());
/// assert_eq!(StoredOutcome::<&str>::Duplicate.value(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a `StoredOutcome` tells whether the message was processed now, replayed or skipped"]
pub enum StoredOutcome<T> {
    /// The message id was claimed now and the body ran, producing this
    /// value, which is stored with the claim.
    Processed(T),
    /// The message id had already been claimed: the body did not run, and
    /// this is the value the first delivery stored.
    Replayed(T),
    /// The message id had already been claimed, and its claim holds no
    /// result (it was made by a handler without `store_result`, or records
    /// a dead message): the body did not run.
    Duplicate,
}

impl<T> StoredOutcome<T> {
    /// `true` when the body ran.
    ///
    /// ```
    /// assert!(inbox_runtime::StoredOutcome::Processed(1).is_processed());
    /// ```
    pub fn is_processed(&self) -> bool {
        matches!(self, StoredOutcome::Processed(_))
    }

    /// `true` when the delivery was a duplicate answered with the stored
    /// value.
    ///
    /// ```
    /// assert!(inbox_runtime::StoredOutcome::Replayed(1).is_replayed());
    /// ```
    pub fn is_replayed(&self) -> bool {
        matches!(self, StoredOutcome::Replayed(_))
    }

    /// The value, computed now or replayed; `None` for a duplicate without
    /// a stored value.
    ///
    /// ```
    /// assert_eq!(inbox_runtime::StoredOutcome::Replayed(5).value(), Some(5));
    /// ```
    pub fn value(self) -> Option<T> {
        match self {
            StoredOutcome::Processed(value) | StoredOutcome::Replayed(value) => Some(value),
            StoredOutcome::Duplicate => None,
        }
    }
}

impl<T> From<T> for StoredOutcome<T> {
    fn from(value: T) -> Self {
        StoredOutcome::Processed(value)
    }
}

/// The value a handler returns when its message is a duplicate.
///
/// A duplicate delivery skips the handler's body, so the `Ok` type of the
/// handler's `Result` must be able to stand for "nothing happened". The inbox
/// implements it for `()` (a duplicate returns `Ok(())`, indistinguishable from
/// a first delivery for the caller) and for [`Outcome<T>`] (a duplicate
/// returns `Ok(Outcome::Duplicate)`). It is deliberately not implemented for
/// `Option<T>` or `Default` types: a made-up value would be mistaken for the
/// body's result.
///
/// ```
/// use inbox_runtime::{OnDuplicate, Outcome};
///
/// assert_eq!(<() as OnDuplicate>::on_duplicate(), ());
/// assert_eq!(<Outcome<i32> as OnDuplicate>::on_duplicate(), Outcome::Duplicate);
/// ```
#[diagnostic::on_unimplemented(
    message = "an idempotent handler cannot return `Ok({Self})`: a duplicate delivery skips the body and has no `{Self}` to return",
    label = "the `Ok` type must be `()` or `inbox_runtime::Outcome<T>`",
    note = "return `Result<(), E>` to treat a duplicate as done, or `Result<inbox_runtime::Outcome<{Self}>, E>` to tell a processed message from a duplicate; to replay a stored result to duplicates, add `store_result` and return `Result<inbox_runtime::StoredOutcome<T>, E>`"
)]
pub trait OnDuplicate {
    /// The value returned, without running the body, for a duplicate delivery.
    fn on_duplicate() -> Self;
}

impl OnDuplicate for () {
    fn on_duplicate() -> Self {}
}

impl<T> OnDuplicate for Outcome<T> {
    fn on_duplicate() -> Self {
        Outcome::Duplicate
    }
}
