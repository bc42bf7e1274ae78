//! Errors: bad input that must not be retried versus database failures that may be.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::digest::Fingerprint;
use crate::duration::format_duration;

/// What is wrong with a refused message id or handler name.
///
/// ```
/// use inbox_runtime::KeyProblem;
/// let problem = KeyProblem::TooLong { bytes: 300, max_bytes: 255 };
/// assert_eq!(problem.to_string(), "it is 300 bytes long, more than the 255 bytes the inbox stores");
/// assert_eq!(KeyProblem::Missing.to_string(), "the message carries no id");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyProblem {
    /// The text is empty.
    Empty,
    /// The text is longer than the column's limit (in UTF-8 bytes).
    TooLong {
        /// Its length in UTF-8 bytes.
        bytes: usize,
        /// The limit in UTF-8 bytes.
        max_bytes: usize,
    },
    /// The text contains a NUL character, which PostgreSQL cannot store.
    ContainsNul {
        /// Where the first NUL is, in bytes.
        byte_offset: usize,
    },
    /// The database refused to store the text: a character its encoding
    /// cannot represent (PostgreSQL 22P05 on a server that is not UTF-8),
    /// or the inbox table's own checks.
    RefusedByDatabase,
    /// The message carries no id: the id expression is an `Option` that is
    /// `None` (an AMQP message without a `message_id` property, a JetStream
    /// message without a `Nats-Msg-Id` header).
    Missing,
    /// The id is bytes that are not UTF-8 text (a Kafka header, say). The
    /// inbox stores ids as text and never converts bytes lossily, since two
    /// different ids could then become the same text.
    NotUtf8 {
        /// How many leading bytes are valid UTF-8: the first invalid byte is
        /// at this offset.
        valid_up_to: usize,
    },
}

impl fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyProblem::Empty => f.write_str("it is empty"),
            KeyProblem::TooLong { bytes, max_bytes } => write!(
                f,
                "it is {bytes} bytes long, more than the {max_bytes} bytes the inbox stores"
            ),
            KeyProblem::ContainsNul { byte_offset } => {
                write!(f, "it contains a NUL character at byte {byte_offset}")
            }
            KeyProblem::RefusedByDatabase => f.write_str(
                "the database refused to store it (a character its encoding cannot \
                 represent, or the inbox table's checks)",
            ),
            KeyProblem::Missing => f.write_str("the message carries no id"),
            KeyProblem::NotUtf8 { valid_up_to } => write!(
                f,
                "it is not UTF-8 text (the byte at offset {valid_up_to} is invalid), and the \
                 inbox stores ids as text without a lossy conversion"
            ),
        }
    }
}

/// What is wrong with a refused retention setting (see
/// [`InboxError::InvalidRetention`]).
///
/// ```
/// use std::time::Duration;
/// use inbox_runtime::RetentionProblem;
///
/// let problem = RetentionProblem::ShorterThanRedelivery {
///     keep: Duration::from_secs(3_600),
///     redelivery_window: Duration::from_secs(86_400),
/// };
/// assert!(problem.to_string().contains("shorter than the redelivery window (1d)"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetentionProblem {
    /// The retention window is zero: every id would be prunable at once.
    ZeroWindow,
    /// The duration is negative (for example `-7d`).
    Negative,
    /// The redelivery window is zero: every broker can redeliver, so say how
    /// late a redelivery (or a manual replay) can come.
    ZeroRedeliveryWindow,
    /// The window is shorter than the redelivery window: ids would be pruned
    /// while their messages can still come back, letting duplicates through.
    ShorterThanRedelivery {
        /// The requested retention window.
        keep: Duration,
        /// The declared redelivery window.
        redelivery_window: Duration,
    },
    /// The duration exceeds [`MAX_RETENTION`](crate::MAX_RETENTION).
    TooLong {
        /// The largest accepted duration.
        max: Duration,
    },
    /// The text is not a duration such as `7d`, `36h`, `90m` or `1d12h`.
    Unparsable {
        /// The rejected text, shortened for display.
        input: String,
    },
    /// The setting restricts pruning to one handler, which the partitioned
    /// layout cannot do: it drops whole generations of every handler.
    HandlerScopeNeedsBatches,
    /// The generation layout was asked to split the window into a number of
    /// generations outside `1..=max`: every claim looks its id up in each
    /// archived generation, so their number is bounded.
    GenerationCount {
        /// The number asked for.
        requested: u32,
        /// The largest accepted number (`prune::partitioned::MAX_GENERATIONS`).
        max: u32,
    },
}

/// Why an outgoing message was refused before anything was written (see
/// [`InboxError::InvalidOutgoingMessage`]).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::outbox::{self, OutgoingMessage};
/// use inbox_runtime::{InboxError, OutgoingProblem};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let error = conn
///     .transaction(|conn| outbox::send(conn, &OutgoingMessage::new("", "x")))
///     .unwrap_err();
/// assert!(matches!(
///     error,
///     InboxError::InvalidOutgoingMessage { problem: OutgoingProblem::Empty { field: "destination" } }
/// ));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutgoingProblem {
    /// The destination, ordering key or a header name is empty.
    Empty {
        /// Which: `destination`, `ordering key` or `header name`.
        field: &'static str,
    },
    /// A text is longer than the outbox stores.
    TooLong {
        /// Which text.
        field: &'static str,
        /// Its length in bytes.
        bytes: usize,
        /// The longest accepted, in bytes.
        max: usize,
    },
    /// A text holds a character no broker or backend takes there (NUL
    /// anywhere; a line break or, in a header name, a colon, which would
    /// split a NATS header).
    Forbidden {
        /// Which text.
        field: &'static str,
        /// The refused character.
        character: char,
    },
    /// The payload could not be encoded (`OutgoingMessage::json`).
    Unencodable {
        /// What the encoder said.
        reason: String,
    },
}

impl fmt::Display for OutgoingProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutgoingProblem::Empty { field } => write!(f, "the {field} is empty"),
            OutgoingProblem::TooLong { field, bytes, max } => {
                write!(f, "the {field} is {bytes} bytes long, more than {max}")
            }
            OutgoingProblem::Forbidden { field, character } => {
                write!(f, "the {field} contains {character:?}")
            }
            OutgoingProblem::Unencodable { reason } => {
                write!(f, "the payload could not be encoded: {reason}")
            }
        }
    }
}

impl fmt::Display for RetentionProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetentionProblem::ZeroWindow => {
                f.write_str("the retention window is zero, so every id could be pruned as soon as it is claimed")
            }
            RetentionProblem::Negative => f.write_str("the duration is negative"),
            RetentionProblem::ZeroRedeliveryWindow => f.write_str(
                "the redelivery window is zero; declare how late a message can be redelivered or replayed",
            ),
            RetentionProblem::ShorterThanRedelivery {
                keep,
                redelivery_window,
            } => write!(
                f,
                "the retention window ({}) is shorter than the redelivery window ({}): ids would be pruned \
                 while their messages can still be redelivered, and those redeliveries would be processed again",
                format_duration(*keep),
                format_duration(*redelivery_window)
            ),
            RetentionProblem::TooLong { max } => {
                write!(f, "the duration is longer than the maximum of {}", format_duration(*max))
            }
            RetentionProblem::Unparsable { input } => write!(
                f,
                "\"{input}\" is not a duration; write a number and a unit (w, d, h, m, s, ms, us), e.g. 7d, 36h or 1d12h"
            ),
            RetentionProblem::HandlerScopeNeedsBatches => f.write_str(
                "the partitioned layout drops whole generations of every handler and cannot prune one handler only; \
                 use batched pruning for a handler-scoped policy",
            ),
            RetentionProblem::GenerationCount { requested, max } => write!(
                f,
                "the window cannot be split into {requested} generations: every claim looks its id up in each \
                 archived generation, so the layout takes 1 to {max}"
            ),
        }
    }
}

/// The details of [`InboxError::Conflict`]: a message id already processed
/// with a different payload.
///
/// ```
/// use inbox_runtime::{Fingerprint, PayloadConflict};
/// let conflict = PayloadConflict {
///     handler: "billing.apply_payment".into(),
///     message_id: "pay-1".into(),
///     stored: Some(Fingerprint::of("amount=250")?),
///     delivered: Fingerprint::of("amount=999")?,
/// };
/// assert!(conflict.to_string().contains("different payload"));
/// # Ok::<(), inbox_runtime::InboxError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadConflict {
    /// The handler that received the message.
    pub handler: String,
    /// The message id, escaped and shortened for display.
    pub message_id: String,
    /// The fingerprint stored by the delivery that processed the id
    /// (`None`: the stored bytes are not a fingerprint, written by
    /// something else than the inbox).
    pub stored: Option<Fingerprint>,
    /// This delivery's fingerprint.
    pub delivered: Fingerprint,
}

impl fmt::Display for PayloadConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let PayloadConflict {
            handler,
            message_id,
            stored,
            delivered,
        } = self;
        write!(
            f,
            "handler `{handler}` refused message id \"{message_id}\": that id was already \
             processed with a different payload (stored fingerprint "
        )?;
        match stored {
            Some(stored) => write!(f, "{stored}")?,
            None => f.write_str("unreadable")?,
        }
        write!(
            f,
            ", this delivery's {delivered}); the body did not run; dead-letter the message, \
             redelivering it will not help"
        )
    }
}

/// Everything the inbox runtime can fail with.
///
/// The split that matters to a consumer is [`InboxError::is_retryable`]:
/// an invalid message id is a property of the message (acknowledge it or send
/// it to a dead-letter queue; redelivering it will fail the same way), while a
/// database failure says nothing about the message (let the broker redeliver).
///
/// ```
/// use inbox_runtime::{ClaimKey, HandlerName, InboxError};
///
/// let err = ClaimKey::new(HandlerName::new("billing")?, "").unwrap_err();
/// assert!(matches!(err, InboxError::InvalidMessageId { .. }));
/// assert!(!err.is_retryable());
/// assert_eq!(
///     err.to_string(),
///     "invalid message id \"\" for handler `billing`: it is empty; the message is malformed and redelivering it will not help"
/// );
/// # Ok::<(), InboxError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum InboxError {
    /// The message's id cannot be stored. Nothing was recorded and the body
    /// did not run. Do not retry.
    InvalidMessageId {
        /// The handler that received the message.
        handler: String,
        /// The rejected id, escaped and shortened for display; empty when
        /// the id has no text to show ([`KeyProblem::Missing`],
        /// [`KeyProblem::NotUtf8`]).
        message_id: String,
        /// What is wrong with it.
        problem: KeyProblem,
    },
    /// The handler's name (its deduplication scope) cannot be stored.
    InvalidHandlerName {
        /// The rejected name, escaped and shortened for display.
        handler: String,
        /// What is wrong with it.
        problem: KeyProblem,
    },
    /// The database failed; [`InboxError::recovery`] says whether to retry
    /// on the same connection or on a new one.
    Database(diesel::result::Error),
    /// A statement inside the handler's transaction failed and the body
    /// ignored its error (`let _ = …`), then returned `Ok` (or its result
    /// could not be stored after it). On PostgreSQL a failed statement
    /// aborts the transaction; on MySQL/MariaDB a deadlock (or a lock wait
    /// timeout with `innodb_rollback_on_timeout`) rolls the whole
    /// transaction back, claim included, and what the body wrote after it
    /// would have started a new one. Either way nothing the body did is
    /// committed: the transaction (or, nested, the handler's savepoint) was
    /// rolled back, the claim with it, and the message can be delivered
    /// again. Propagate statement errors with `?` instead.
    IgnoredStatementFailure {
        /// The error the database gave at commit (or savepoint release).
        source: diesel::result::Error,
    },
    /// The handler's transaction could not be ended cleanly: rolling it back
    /// (or its savepoint) failed, or the database had already rolled back
    /// the transaction around it (MySQL/MariaDB end the whole transaction on
    /// a deadlock, also when the handler runs nested in the caller's
    /// transaction). Nothing of that transaction commits, except when the
    /// connection failed during the handler's own `COMMIT`: the server may
    /// have committed before the connection went, so the outcome is unknown,
    /// and the redelivery tells (a duplicate if it did commit). The
    /// connection's transaction manager is marked broken, so every further
    /// transaction on it fails with `BrokenTransactionManager` instead of
    /// running outside any transaction: replace the connection (pools
    /// discard it on return), then deliver the message again.
    TransactionLost {
        /// Whether the handler ran inside a transaction its caller opened:
        /// then the caller's whole transaction is lost, not only the
        /// handler's work.
        nested: bool,
        /// The error of the statement that showed it.
        source: diesel::result::Error,
    },
    /// The message was not processed: the transaction of its batch
    /// ([`run_idempotent_batch`](crate::run_idempotent_batch)) met database
    /// trouble with another message of the batch, whose result carries the
    /// error, and nothing of that transaction committed. Deliver the
    /// message again, after reconnecting when `recovery` says so.
    BatchAborted {
        /// The id of the message whose result carries the error.
        cause_message_id: String,
        /// What that error's [`InboxError::recovery`] says.
        recovery: Recovery,
    },
    /// The handler rejected the message as permanently bad (built with
    /// [`InboxError::rejected`] and returned from the body): its effects were
    /// rolled back, and the id was recorded as dead, so later deliveries skip
    /// the body (as duplicates) and [`dead_letters`](crate::dead_letters)
    /// lists it. Dead-letter the message; retrying will not help.
    Rejected {
        /// Why, as the handler said it (at most
        /// [`MAX_ERROR_TEXT_BYTES`](crate::MAX_ERROR_TEXT_BYTES)).
        reason: String,
    },
    /// The body failed on this message as many times as the handler's
    /// [`MaxAttempts`](crate::MaxAttempts) allows: this delivery's effects
    /// were rolled back, and the id was recorded as dead, so later
    /// deliveries skip the body (as duplicates) and
    /// [`dead_letters`](crate::dead_letters) lists it. Dead-letter the
    /// message; retrying will not help.
    AttemptsExhausted {
        /// The handler's limit, which the failed attempts counted reached
        /// (the count itself, in [`dead_letters::list`](crate::dead_letters::list),
        /// is higher when the limit was lowered between deliveries; and it is
        /// a lower bound: see [`MaxAttempts`](crate::MaxAttempts)).
        attempts: u32,
        /// The last attempt's error, as text (at most
        /// [`MAX_ERROR_TEXT_BYTES`](crate::MAX_ERROR_TEXT_BYTES)).
        last_error: String,
    },
    /// The message id was already processed with a different payload: the
    /// fingerprint stored with its claim (`#[idempotent(fingerprint = …)]`)
    /// is not this delivery's. The body did not run and nothing was
    /// written. Either the producer reused an id for a different message,
    /// or the payload changed on the way: dead-letter it and look; retrying
    /// will not help.
    Conflict(Box<PayloadConflict>),
    /// The fingerprint expression's value could not be encoded: its
    /// `serde::Serialize` implementation failed. Nothing was recorded and
    /// the body did not run. Do not retry.
    InvalidFingerprint {
        /// The serializer's error.
        reason: String,
    },
    /// A handler with `store_result` could not store or replay its result
    /// (see [`StoredResultProblem`]). When storing failed, the body's
    /// effects were rolled back with the claim. Do not retry: the same
    /// message fails the same way.
    ///
    /// [`StoredResultProblem`]: StoredResultProblem
    StoredResult {
        /// The handler that received the message.
        handler: String,
        /// The message id, escaped and shortened for display.
        message_id: String,
        /// What went wrong.
        problem: StoredResultProblem,
    },
    /// The handler's deduplication scope is declared by another
    /// `#[idempotent]` handler of the program too, and not all of them say
    /// `shared_scope` (see [`registry::check`](crate::registry::check)):
    /// each would skip, as duplicates, the messages the other processed.
    /// Nothing was claimed and the body did not run. Retryable: the message
    /// stays with the broker until a deploy gives each handler its own
    /// scope (or declares the sharing); dead-lettering it would not lose it
    /// either, but would leave every message of the scope to be replayed by
    /// hand.
    SharedScope {
        /// The shared scope.
        handler: String,
        /// The handlers that declare it: `module::function (file:line:column)`.
        handlers: Vec<String>,
    },
    /// Applying the inbox's migrations failed.
    Migration(Box<dyn StdError + Send + Sync>),
    /// Another delivery of the same message is still in flight (its claim
    /// is not committed or rolled back yet) and the claim waited for it as
    /// long as the delivery's [`ClaimWait`](crate::ClaimWait) allows:
    /// nothing ran, nothing was written and no attempt was counted.
    /// Redeliver the copy later ([`Recovery::RetryLater`]): once the first
    /// delivery commits, the copy is a duplicate; if it fails, the copy
    /// processes the message.
    InProgress {
        /// The handler (deduplication scope).
        handler: String,
        /// The message id, as a preview.
        message_id: String,
        /// How long the claim waited.
        waited: Duration,
    },
    /// An operation that must run inside the caller's transaction (such as
    /// recording an outgoing message, which commits or rolls back with the
    /// writes it announces) was called on a connection with none open.
    /// Nothing was written. A bug in the calling code: retrying will not help.
    OutsideTransaction {
        /// What was refused.
        operation: &'static str,
    },
    /// An operation that commits work of its own (such as an outbox relay's
    /// lease) was called inside a transaction, where its commit would be the
    /// caller's. Nothing was done. A bug in the calling code: retrying will
    /// not help.
    InsideTransaction {
        /// What was refused.
        operation: &'static str,
    },
    /// An outgoing message was refused before anything was written (see
    /// [`OutgoingProblem`]). Retrying the same message will not help.
    InvalidOutgoingMessage {
        /// What is wrong with it.
        problem: OutgoingProblem,
    },
    /// A pruning batch size of zero, or larger than
    /// [`MAX_BATCH_SIZE`](crate::prune::MAX_BATCH_SIZE). Fix the
    /// configuration; retrying will not help.
    InvalidBatchSize {
        /// The refused batch size.
        requested: u32,
        /// The largest accepted batch size.
        max: u32,
    },
    /// A retention policy or pruning setting was refused: pruning with it
    /// would be unsafe or meaningless (see [`RetentionProblem`]). Fix the
    /// configuration; retrying will not help.
    ///
    /// [`RetentionProblem`]: crate::RetentionProblem
    InvalidRetention {
        /// The handler the setting was for, when it was handler-specific.
        handler: Option<String>,
        /// What is wrong with it.
        problem: RetentionProblem,
    },
}

impl InboxError {
    /// `true` for failures that say nothing about the message itself, so a
    /// redelivery may succeed (perhaps on a new connection: see
    /// [`recovery`](Self::recovery)); `false` for input the inbox will never
    /// accept.
    ///
    /// ```
    /// use inbox_runtime::InboxError;
    /// assert!(InboxError::Database(diesel::result::Error::NotFound).is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        self.recovery().is_retryable()
    }

    /// `true` when the message (its id) is malformed: dead-letter it.
    ///
    /// ```
    /// use inbox_runtime::{ClaimKey, HandlerName};
    /// let err = ClaimKey::new(HandlerName::new("h")?, "a\0b").unwrap_err();
    /// assert!(err.is_invalid_message());
    /// # Ok::<(), inbox_runtime::InboxError>(())
    /// ```
    pub fn is_invalid_message(&self) -> bool {
        matches!(self, InboxError::InvalidMessageId { .. })
    }

    /// `true` when the id was already processed with a different payload
    /// ([`InboxError::Conflict`]): dead-letter the message.
    ///
    /// ```
    /// use inbox_runtime::{Fingerprint, InboxError, PayloadConflict};
    /// let conflict = InboxError::Conflict(Box::new(PayloadConflict {
    ///     handler: "h".into(),
    ///     message_id: "m".into(),
    ///     stored: None,
    ///     delivered: Fingerprint::of("x")?,
    /// }));
    /// assert!(conflict.is_conflict() && !conflict.is_retryable());
    /// # Ok::<(), InboxError>(())
    /// ```
    pub fn is_conflict(&self) -> bool {
        matches!(self, InboxError::Conflict(_))
    }

    /// A business rejection: return it from a handler's body (through the
    /// handler's error type) when the message can never succeed, such as an
    /// order for an item that does not exist. The body's effects roll back,
    /// the id is recorded as dead without further attempts, and the delivery
    /// fails with this error, which [`ack_decision`](crate::ack_decision)
    /// dead-letters. `reason` is kept, shortened to
    /// [`MAX_ERROR_TEXT_BYTES`](crate::MAX_ERROR_TEXT_BYTES).
    ///
    /// ```
    /// use inbox_runtime::InboxError;
    /// let rejected = InboxError::rejected("item 17 is discontinued");
    /// assert!(!rejected.is_retryable());
    /// assert!(rejected.to_string().contains("item 17 is discontinued"));
    /// ```
    pub fn rejected(reason: impl fmt::Display) -> InboxError {
        InboxError::Rejected {
            reason: crate::text::error_text(&reason),
        }
    }

    /// `true` for a business rejection ([`InboxError::rejected`]).
    ///
    /// ```
    /// assert!(inbox_runtime::InboxError::rejected("no").is_rejection());
    /// ```
    pub fn is_rejection(&self) -> bool {
        matches!(self, InboxError::Rejected { .. })
    }

    /// Finds the inbox error carried inside a Diesel error, for handlers whose
    /// error type is plain `diesel::result::Error` (see the `From` impl below).
    ///
    /// ```
    /// use inbox_runtime::{ClaimKey, HandlerName, InboxError};
    /// let inbox_err = ClaimKey::new(HandlerName::new("h")?, "").unwrap_err();
    /// let diesel_err = diesel::result::Error::from(inbox_err);
    /// assert!(InboxError::find_in(&diesel_err).is_some_and(InboxError::is_invalid_message));
    /// assert!(InboxError::find_in(&diesel::result::Error::NotFound).is_none());
    /// # Ok::<(), InboxError>(())
    /// ```
    pub fn find_in(error: &diesel::result::Error) -> Option<&InboxError> {
        match error {
            diesel::result::Error::QueryBuilderError(inner) => inner.downcast_ref(),
            _ => None,
        }
    }
}

impl fmt::Display for InboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InboxError::InvalidMessageId {
                handler,
                problem: problem @ KeyProblem::Missing,
                ..
            } => write!(
                f,
                "invalid message id for handler `{handler}`: {problem}, so it cannot be \
                 deduplicated; redelivering it will not help"
            ),
            InboxError::InvalidMessageId {
                handler,
                problem: problem @ KeyProblem::NotUtf8 { .. },
                ..
            } => write!(
                f,
                "invalid message id for handler `{handler}`: {problem}; the message is \
                 malformed and redelivering it will not help"
            ),
            InboxError::InvalidMessageId {
                handler,
                message_id,
                problem,
            } => write!(
                f,
                "invalid message id \"{message_id}\" for handler `{handler}`: {problem}; \
                 the message is malformed and redelivering it will not help"
            ),
            InboxError::InvalidHandlerName { handler, problem } => {
                write!(f, "invalid inbox handler name \"{handler}\": {problem}")
            }
            InboxError::Database(_) => f.write_str("the inbox's database operation failed"),
            InboxError::IgnoredStatementFailure { .. } => f.write_str(
                "a statement failed inside the handler and its error was ignored; \
                 the transaction was rolled back and nothing was committed",
            ),
            InboxError::TransactionLost { nested: true, .. } => f.write_str(
                "the transaction the handler ran in, the caller's outer transaction \
                 included, is lost (the database rolled it back, or the connection \
                 failed); nothing of it will commit, and the connection refuses further \
                 transactions: replace it, then redeliver",
            ),
            InboxError::TransactionLost { nested: false, .. } => f.write_str(
                "the handler's transaction could not be ended cleanly (the connection \
                 failed); nothing of it committed, unless the connection failed during \
                 COMMIT, when the outcome is unknown; the connection refuses further \
                 transactions: replace it, then redeliver (a committed delivery comes \
                 back as a duplicate)",
            ),
            InboxError::BatchAborted {
                cause_message_id, ..
            } => write!(
                f,
                "not processed: the batch's transaction failed on the database with message \
                 id \"{cause_message_id}\" (its result has the error), and nothing of it \
                 committed; deliver this message again"
            ),
            InboxError::Rejected { reason } => {
                write!(f, "{REJECTED_PREFIX}{reason}{REJECTED_SUFFIX}")
            }
            InboxError::AttemptsExhausted {
                attempts,
                last_error,
            } => write!(
                f,
                "the message failed {attempts} attempts (the last with: {last_error}); it is recorded as dead \
                 and will not be processed again until an operator revives it"
            ),
            InboxError::Conflict(conflict) => conflict.fmt(f),
            InboxError::InvalidFingerprint { reason } => write!(
                f,
                "the message's fingerprint could not be taken: {reason}; redelivering it \
                 will not help"
            ),
            InboxError::StoredResult {
                handler,
                message_id,
                problem,
            } => write!(
                f,
                "handler `{handler}`, message id \"{message_id}\": {problem}"
            ),
            InboxError::SharedScope { handler, handlers } => write!(
                f,
                "handler scope `{handler}` is declared by {} handlers ({}), so each would skip the \
                 messages the others processed; nothing ran: give each its own `handler = \"…\"` \
                 (or mark all of them `shared_scope`), deploy, and redeliver",
                handlers.len(),
                handlers.join(", ")
            ),
            InboxError::Migration(_) => f.write_str("applying the inbox's migrations failed"),
            InboxError::InProgress {
                handler,
                message_id,
                waited,
            } => write!(
                f,
                "another delivery of message {message_id:?} (handler `{handler}`) is still in \
                 flight: the claim waited {} for it; redeliver the message later",
                format_duration(*waited)
            ),
            InboxError::OutsideTransaction { operation } => write!(
                f,
                "{operation} must run inside a transaction, and the connection has none open: \
                 nothing was written"
            ),
            InboxError::InsideTransaction { operation } => write!(
                f,
                "{operation} commits on its own and cannot run inside a transaction: nothing was done"
            ),
            InboxError::InvalidOutgoingMessage { problem } => {
                write!(
                    f,
                    "invalid outgoing message: {problem}; nothing was written"
                )
            }
            InboxError::InvalidBatchSize { requested, max } => write!(
                f,
                "invalid pruning batch size: {requested} is not between 1 and {max}"
            ),
            InboxError::InvalidRetention {
                handler: None,
                problem,
            } => {
                write!(f, "invalid retention setting: {problem}")
            }
            InboxError::InvalidRetention {
                handler: Some(handler),
                problem,
            } => write!(
                f,
                "invalid retention setting for handler `{handler}`: {problem}"
            ),
        }
    }
}

/// The text of [`InboxError::Rejected`] around its reason (read back by
/// `failure::rejection_reason` through wrappers that forward `Display`).
pub(crate) const REJECTED_PREFIX: &str = "the handler rejected the message: ";
/// See [`REJECTED_PREFIX`].
pub(crate) const REJECTED_SUFFIX: &str = "; it is recorded as dead and will not be processed again";

impl StdError for InboxError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            InboxError::Database(error)
            | InboxError::IgnoredStatementFailure { source: error }
            | InboxError::TransactionLost { source: error, .. } => Some(error),
            InboxError::Migration(error) => Some(&**error),
            // Never redelivered: a marker that stays reachable through the
            // source chain when an application error wraps this one with
            // `#[error(transparent)]` (which forwards `source`, not the
            // error itself), so `ack_decision` still dead-letters it.
            InboxError::InvalidMessageId { .. }
            | InboxError::AttemptsExhausted { .. }
            | InboxError::Conflict(_)
            | InboxError::InvalidFingerprint { .. }
            | InboxError::StoredResult { .. } => Some(&FINAL),
            InboxError::Rejected { .. } => Some(&REJECTED),
            // Retried, but never counted as a failed attempt of a handler
            // whose body called the refused one.
            InboxError::SharedScope { .. } => Some(&MISCONFIGURED),
            // Redelivered later, never counted: also through a wrapper that
            // forwards `source()`.
            InboxError::InProgress { .. } => Some(&IN_PROGRESS),
            _ => None,
        }
    }
}

impl From<diesel::result::Error> for InboxError {
    fn from(error: diesel::result::Error) -> Self {
        InboxError::Database(error)
    }
}

/// Lets handlers whose error type is `diesel::result::Error` report inbox
/// errors without an error type of their own: a database failure is passed
/// through unchanged, anything else travels as a
/// `QueryBuilderError` that [`InboxError::find_in`] recovers.
impl From<InboxError> for diesel::result::Error {
    fn from(error: InboxError) -> Self {
        match error {
            InboxError::Database(error) => error,
            other => diesel::result::Error::QueryBuilderError(Box::new(other)),
        }
    }
}

/// The error type of an idempotent handler.
///
/// It must take Diesel's errors (the transaction's own failures) and the
/// inbox's (a malformed message id, a rejection), and be a
/// `std::error::Error + 'static`, so the runtime can tell a rejection and a
/// database failure from a failed attempt, and [`ack_decision`] can tell
/// the broker what to do: it looks for an [`InboxError`] or a
/// `diesel::result::Error` along the error's `source()` chain.
/// `diesel::result::Error` qualifies as it is; for an error type of your
/// own, add a variant with `#[from] inbox_runtime::InboxError` (plain or
/// `#[error(transparent)]`, both are found) or implement
/// `From<inbox_runtime::InboxError>` by hand and return the inbox error from
/// `source()`. A type written by hand that forgets `source()` compiles, and
/// then every answer reads as the handler's own failure:
/// [`registry::check`](crate::registry::check) reports such a type at
/// start-up, and the [testing](crate::testing) helpers fail on it.
///
/// [`ack_decision`]: crate::ack_decision
///
/// ```
/// use inbox_runtime::{HandlerError, InboxError};
///
/// #[derive(Debug)]
/// enum AppError { Db(diesel::result::Error), Inbox(InboxError) }
/// impl From<diesel::result::Error> for AppError {
///     fn from(e: diesel::result::Error) -> Self { AppError::Db(e) }
/// }
/// impl From<InboxError> for AppError {
///     fn from(e: InboxError) -> Self { AppError::Inbox(e) }
/// }
/// impl std::fmt::Display for AppError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("app error") }
/// }
/// impl std::error::Error for AppError {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         match self { AppError::Db(e) => Some(e), AppError::Inbox(e) => Some(e) }
///     }
/// }
///
/// fn assert_handler_error<E: HandlerError>() {}
/// assert_handler_error::<AppError>();
/// assert_handler_error::<diesel::result::Error>();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error type of an idempotent handler",
    label = "this error type must implement `std::error::Error`, `From<diesel::result::Error>` and `From<inbox_runtime::InboxError>`",
    note = "derive `thiserror::Error` with a `#[from] inbox_runtime::InboxError` variant (and one for `diesel::result::Error`), or return `Result<_, diesel::result::Error>`",
    note = "written by hand, the type must also return the converted error from `source()`: `ack_decision` reads the inbox's answers (dead-letter, retry later) through it, and `registry::check()` reports a type that hides them"
)]
pub trait HandlerError:
    From<diesel::result::Error> + From<InboxError> + StdError + 'static
{
}

impl<E> HandlerError for E where
    E: From<diesel::result::Error> + From<InboxError> + StdError + 'static
{
}

/// Converts the runtime's error into a handler's: a database failure as the
/// Diesel error it is (so `E`'s Diesel variant sees every database error),
/// anything else as the inbox error.
pub(crate) fn into_handler_error<E: HandlerError>(error: InboxError) -> E {
    match error {
        InboxError::Database(error) => E::from(error),
        other => E::from(other),
    }
}

/// What a consumer should do after a failed delivery.
///
/// ```
/// use inbox_runtime::{recovery, Recovery};
/// use diesel::result::{DatabaseErrorKind, Error};
///
/// let conflict = Error::DatabaseError(DatabaseErrorKind::SerializationFailure, Box::new("could not serialize access".to_owned()));
/// assert_eq!(recovery(&conflict), Recovery::Retry);
/// let gone = Error::DatabaseError(DatabaseErrorKind::ClosedConnection, Box::new("server closed the connection unexpectedly".to_owned()));
/// assert_eq!(recovery(&gone), Recovery::Reconnect);
/// assert_eq!(recovery(&Error::BrokenTransactionManager), Recovery::Reconnect);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Recovery {
    /// Deliver the message again, on the same connection: nothing was
    /// committed, and the failure says nothing about the message (a lock
    /// conflict, a serialization failure, or a database error the inbox
    /// cannot attribute to the connection or the message).
    Retry,
    /// The connection cannot be used any more (closed, killed, read-only,
    /// a server shutting down or not ready, a transaction manager Diesel
    /// refuses to use, prepared statements the server no longer has, as
    /// after `DEALLOCATE ALL` or behind PgBouncer's transaction pooling
    /// with Diesel's statement cache on): get a new connection (a pool does
    /// this when the broken one is returned: a delivery marks a connection
    /// whose statements are gone broken), then deliver the message again.
    /// Retrying on the same connection fails forever.
    Reconnect,
    /// Never retry: the message is malformed (an id the inbox cannot store,
    /// another payload under a claimed id) or a setting is wrong in a way no
    /// redelivery mends (a handler name the inbox cannot store). Redelivering
    /// fails the same way: dead-letter the message or fix the setting. (A
    /// scope declared by two handlers, [`InboxError::SharedScope`], is
    /// [`Retry`](Recovery::Retry) instead: the message is fine, and the
    /// deployment that fixes the scopes processes it.)
    Never,
    /// Deliver the message again *later*, after a delay (JetStream `Nak`
    /// with a delay, an AMQP requeue through a delay queue; see
    /// [`AckDecision::RetryLater`](crate::AckDecision::RetryLater)):
    /// another delivery of the same message is still in flight
    /// ([`InboxError::InProgress`]). Redelivered at once, the copy would
    /// wait again; once the first delivery ends, it is a duplicate or
    /// processes the message.
    RetryLater,
}

/// What went wrong with a stored result (see [`InboxError::StoredResult`]).
///
/// ```
/// use inbox_runtime::StoredResultProblem;
/// let problem = StoredResultProblem::TooLarge { bytes: 70_000, max_bytes: 65_536 };
/// assert!(problem.to_string().contains("70000 bytes"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoredResultProblem {
    /// The result's JSON is longer than [`MAX_STORED_RESULT_BYTES`](crate::MAX_STORED_RESULT_BYTES); the
    /// delivery's effects were rolled back.
    TooLarge {
        /// Its length.
        bytes: usize,
        /// The limit.
        max_bytes: usize,
    },
    /// The result could not be encoded as JSON (its `Serialize`
    /// implementation failed, or a map has keys JSON cannot have); the
    /// delivery's effects were rolled back.
    Unencodable {
        /// The encoder's error.
        reason: String,
    },
    /// The stored result could not be read back as the handler's result
    /// type (the type changed since it was stored). The message was
    /// processed, by an earlier delivery; only its result is unavailable.
    Unreadable {
        /// The decoder's error.
        reason: String,
    },
}

impl fmt::Display for StoredResultProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoredResultProblem::TooLarge { bytes, max_bytes } => write!(
                f,
                "the handler's result is {bytes} bytes as JSON, more than the {max_bytes} bytes \
                 the inbox stores; its effects were rolled back"
            ),
            StoredResultProblem::Unencodable { reason } => write!(
                f,
                "the handler's result cannot be stored as JSON ({reason}); its effects were \
                 rolled back"
            ),
            StoredResultProblem::Unreadable { reason } => write!(
                f,
                "the message was already processed, but its stored result cannot be read back \
                 as the handler's result type ({reason})"
            ),
        }
    }
}

/// What a [`Marker`] in an inbox error's `source()` chain says: read by
/// [`ack_decision`](crate::ack_decision) and by the count of failed
/// attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marks {
    /// Never to be redelivered: an invalid id, exhausted attempts.
    Final,
    /// A business rejection.
    Rejected,
    /// A shared scope: retried once the deploy is fixed, never counted.
    Misconfigured,
    /// Another delivery of the message is in flight: redelivered later,
    /// never counted.
    InProgress,
}

/// The `source()` of the inbox errors that must never be redelivered, so
/// that they are recognised through a wrapper that forwards `source()`
/// (`#[error(transparent)]`) as well as through one that returns them.
#[derive(Debug)]
pub(crate) struct Marker {
    pub(crate) marks: Marks,
    text: &'static str,
}

impl fmt::Display for Marker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text)
    }
}

impl StdError for Marker {}

/// Marks an invalid id and exhausted attempts.
pub(crate) static FINAL: Marker = Marker {
    marks: Marks::Final,
    text: "redelivering this message will not help: dead-letter it",
};

/// Marks a delivery refused for a shared scope.
pub(crate) static MISCONFIGURED: Marker = Marker {
    marks: Marks::Misconfigured,
    text: "the handler's scope is shared with another handler: redeliver once the deploy is fixed",
};

/// Marks a copy refused while another delivery of its message runs.
pub(crate) static IN_PROGRESS: Marker = Marker {
    marks: Marks::InProgress,
    text: "another delivery of this message is in flight: redeliver it later",
};

/// Marks a business rejection.
pub(crate) static REJECTED: Marker = Marker {
    marks: Marks::Rejected,
    text: "the handler rejected this message: dead-letter it",
};
