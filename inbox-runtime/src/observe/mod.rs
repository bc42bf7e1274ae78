//! What the runtime reports about its work: a span per delivery and a few
//! events through [`tracing`](https://docs.rs/tracing) (feature `tracing`),
//! counters and histograms through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`).
//!
//! Both features are off by default, and then nothing here costs anything:
//! the runners' calls into this module are empty inlined functions, and no
//! clock is read. With a feature on but no subscriber (or recorder)
//! installed, the cost is the facade's check that nobody listens; the
//! figures are in `BENCHMARKS.md` ("What observability costs").
//!
//! Everything is reported with the target [`TARGET`] (`inbox_runtime`), so
//! `RUST_LOG=inbox_runtime=debug` (with `tracing-subscriber`'s `EnvFilter`)
//! selects all of it.
//!
//! # Outcomes
//!
//! Every delivery ends with one outcome, the `inbox.outcome` field of its
//! span and the `outcome` label of its metrics:
//!
//! | outcome | what happened |
//! |---|---|
//! | `processed` | the id was claimed, the body ran and its effects committed with the claim |
//! | `duplicate` | the id was already claimed: the body did not run |
//! | `failed` | the body returned an error or panicked; everything rolled back and the failed attempt was counted where it could be (the message may be delivered again) |
//! | `rejected` | the body returned [`InboxError::rejected`](crate::InboxError::rejected): the message is recorded as dead |
//! | `dead` | the failed attempt that used up the handler's [`MaxAttempts`](crate::MaxAttempts): the message is recorded as dead |
//! | `invalid_id` | the message id cannot be stored (empty, too long, a NUL, refused by the database): nothing ran |
//! | `database_error` | the inbox's own database work failed (begin, claim, commit, rollback): nothing committed |
//! | `conflict` | the id was already processed with a different payload ([`InboxError::Conflict`]): the body did not run |
//! | `refused` | the payload could not be fingerprinted, or a duplicate's stored result could not be read back: the body did not run |
//! | `shared_scope` | the handler's scope is declared by another handler too ([`InboxError::SharedScope`], see [`registry`](crate::registry)): nothing ran |
//! | `in_progress` | another delivery of the id was still in flight when the claim's bound ([`ClaimWait`](crate::ClaimWait)) passed ([`InboxError::InProgress`]): nothing ran, redeliver later |
//!
//! A delivery whose future is dropped before it ends (a cancelled async
//! handler) reports no outcome: its span closes without one, and no counter
//! moves.
//!
//! # Spans (feature `tracing`)
//!
//! One span per delivery, named [`SPAN_NAME`] (`inbox.process`), at `INFO`,
//! a child of the span current when the handler is called (the consumer's
//! own, for instance). The body runs inside it (an async body is
//! instrumented with it), so what the handler logs and the spans it opens
//! nest under the delivery. The span is opened before the claim and closed
//! when the delivery ends; fields known only at the end are recorded then.
//!
//! | field | value |
//! |---|---|
//! | `messaging.operation.type` | `"process"`: OpenTelemetry's operation type for a consumer handling a message |
//! | `messaging.operation.name` | `"process"`: the inbox is no messaging system with operation names of its own, so the operation type's |
//! | `messaging.message.id` | the message id the handler deduplicates on, as stored (for an invalid id: its escaped, shortened form). It is the producer-assigned id of the `#[idempotent(id = …)]` expression, which can differ from the broker's own message id (Kafka has none but its offsets) |
//! | `inbox.handler` | the handler name: the deduplication scope |
//! | `inbox.outcome` | the outcome, at the end (table above) |
//! | `inbox.attempt` | for `dead`: the attempts made, the limit. Not recorded when unknown (a failed attempt's count is not read back) |
//! | `inbox.claim_wait_ms` | milliseconds (`f64`) from the start of the delivery until the claim was decided: a claim waits on a concurrent delivery of the same id |
//! | `inbox.duration_ms` | milliseconds (`f64`) from the start of the delivery to its end: claim, body, commit or rollback, and recording a failure |
//! | `error.type` | for the failing outcomes (`failed`, `rejected`, `dead`, `invalid_id`, `database_error`, `conflict`, `refused`): the outcome; unset on success, as OpenTelemetry asks |
//! | `otel.status_code` | `"error"` with `error.type` (`tracing-opentelemetry` sets the span's status from it) |
//!
//! Left out on purpose: `messaging.system`, `messaging.destination.name`
//! and `messaging.consumer.group.name` are the broker's and the consumer's
//! to say, not the inbox's (a handler name is a deduplication scope, not a
//! consumer group); set them on the consumer's span around the handler.
//! The span kind is left to that span as well (`otel.kind` is not set: the
//! consumer's own span is the one OpenTelemetry expects to be `CONSUMER`).
//!
//! # Events (feature `tracing`)
//!
//! Each with the delivery's span as parent (so with its fields), target
//! `inbox_runtime`:
//!
//! | event name | level | when | fields |
//! |---|---|---|---|
//! | `inbox.claim_retry` | `DEBUG` | a claim lost a lock conflict (a MySQL/MariaDB deadlock, a serialization failure) and is tried again at once | `inbox.claim_try` (the number of the try about to start: 2 for the first retry, at most [`CLAIM_ATTEMPTS`](crate::CLAIM_ATTEMPTS)), `error` |
//! | `inbox.dead_lettered` | `WARN` | a message was recorded as dead: rejected, or its attempts used up | `inbox.handler`, `messaging.message.id`, `inbox.outcome` (`rejected` or `dead`), `inbox.attempt` (for `dead`), `inbox.reason` (the rejection's reason) or `inbox.last_error` (the last attempt's error) |
//! | `inbox.database_error` | `WARN` | a delivery ended in `database_error` | `inbox.handler`, `messaging.message.id`, `error` |
//! | `inbox.refused` | `WARN` | a delivery ended in `conflict` or `refused` | `inbox.handler`, `messaging.message.id`, `inbox.outcome`, `error` |
//! | `inbox.shared_scope` | `ERROR` | a delivery ended in `shared_scope` | `inbox.handler`, `messaging.message.id`, `error` |
//! | `inbox.in_progress` | `INFO` | a delivery ended in `in_progress` | `inbox.handler`, `messaging.message.id`, `error` |
//! | `inbox.shared_scopes` | `ERROR` | once per process, at the first delivery, when [`registry::check`](crate::registry::check) fails (no delivery span; also through `log` with feature `log`) | `inbox.scopes` (how many), `error` (the check's report) |
//! | `inbox.unregistered_scopes` | `WARN` | once per pruning run that found ids of scopes no registered handler declares (no delivery span; also through `log`) | `inbox.scopes` (how many), `inbox.handlers` (the scopes, comma-separated) |
//! | `inbox.pruned` | `DEBUG` | a pruning batch committed (no delivery span) | `inbox.table`, `inbox.handler` (when the batch pruned one handler), `inbox.rows` |
//! | `inbox.outbox_refused` | `INFO` | the broker refused an outgoing message; it will be retried (no delivery span) | `messaging.destination.name`, `error` |
//! | `inbox.outbox_dead` | `WARN` | the broker refused an outgoing message for the last time: it is dead (see [`outbox::dead`](crate::outbox::dead)) | `messaging.destination.name`, `error` |
//!
//! # Metrics (feature `metrics`)
//!
//! Recorded through whatever recorder is installed (none: nothing is kept).
//! Call [`describe_metrics`] after installing it to give it the units and
//! descriptions below.
//!
//! | name | kind | unit | labels | what |
//! |---|---|---|---|---|
//! | [`inbox_messages_total`](MESSAGES_TOTAL) | counter | deliveries | `handler`, `outcome` | deliveries by how they ended (outcomes above) |
//! | [`inbox_handler_duration_seconds`](HANDLER_DURATION_SECONDS) | histogram | seconds | `handler`, `outcome` | a delivery from its start to its end, as `inbox.duration_ms` |
//! | [`inbox_claim_wait_seconds`](CLAIM_WAIT_SECONDS) | histogram | seconds | `handler` | from a delivery's start until its claim was decided, claimed or duplicate (retries included), as `inbox.claim_wait_ms` |
//! | [`inbox_claim_retries_total`](CLAIM_RETRIES_TOTAL) | counter | retries | `handler` | claims tried again after losing a lock conflict |
//! | [`inbox_pruned_rows_total`](PRUNED_ROWS_TOTAL) | counter | rows | `table`, `handler` (only on batches that pruned one handler) | rows deleted by committed pruning batches (`Prune::run`, `run_async`, the background pruners; not the partitioned layout's dropped generations) |
//!
//! | [`inbox_outbox_published_total`](OUTBOX_PUBLISHED_TOTAL) | counter | messages | `destination` | outgoing messages the broker confirmed, marked sent |
//! | [`inbox_outbox_refused_total`](OUTBOX_REFUSED_TOTAL) | counter | publishes | `destination`, `dead` | publishes the broker refused (`dead="true"`: the last one, the message is dead) |
//! | [`inbox_outbox_unavailable_total`](OUTBOX_UNAVAILABLE_TOTAL) | counter | messages | | messages given back uncounted because the broker could not take them |
//! | [`inbox_outbox_publish_delay_seconds`](OUTBOX_PUBLISH_DELAY_SECONDS) | histogram | seconds | `destination` | from an outgoing message's recording (the database's clock) to the broker's confirmation (the relay's clock): the commit-to-publish latency, plus the transaction's own time after the write; keep the clocks in sync (NTP) |
//!
//! The outbox's backlog (pending messages, dead ones, the age of the oldest
//! pending one) is a query, not a counter: [`outbox::backlog`](crate::outbox::backlog),
//! for a health endpoint or a gauge of your own.
//!
//! The `handler` label is the handler name, a handful of values per
//! service; the message id is never a label. `table` is the table a batch
//! deleted from (`inbox_messages`).
//!
//! # Example
//!
//! ```
//! # #[cfg(all(feature = "sqlite", feature = "metrics"))] {
//! use diesel::prelude::*;
//! use inbox_runtime::{observe, run_idempotent, ClaimKey, HandlerName};
//!
//! // Install a recorder (here: none, so the counters go nowhere), then describe.
//! observe::describe_metrics();
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! inbox_runtime::setup(&mut conn)?;
//! let key = ClaimKey::new(HandlerName::new("billing")?, "m-1")?;
//! run_idempotent(&mut conn, key, |_| Ok::<(), diesel::result::Error>(()))?;
//! assert_eq!(observe::MESSAGES_TOTAL, "inbox_messages_total");
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
#[cfg(any(feature = "tracing", feature = "metrics"))]
use std::time::{Duration, Instant};

use crate::error::InboxError;
use crate::key::{ClaimKey, HandlerName};

#[cfg(feature = "metrics")]
mod metrics;
#[cfg(feature = "tracing")]
mod tracing;

#[cfg(feature = "metrics")]
pub use self::metrics::describe_metrics;

/// The target of every span, event and metric the inbox reports.
///
/// ```
/// assert_eq!(inbox_runtime::observe::TARGET, "inbox_runtime");
/// ```
pub const TARGET: &str = "inbox_runtime";

/// The name of the span of one delivery (feature `tracing`).
///
/// ```
/// assert_eq!(inbox_runtime::observe::SPAN_NAME, "inbox.process");
/// ```
pub const SPAN_NAME: &str = "inbox.process";

/// Counter of deliveries, labels `handler` and `outcome` (feature `metrics`).
///
/// ```
/// assert_eq!(inbox_runtime::observe::MESSAGES_TOTAL, "inbox_messages_total");
/// ```
pub const MESSAGES_TOTAL: &str = "inbox_messages_total";

/// Histogram of a delivery's duration in seconds, labels `handler` and
/// `outcome` (feature `metrics`).
///
/// ```
/// assert_eq!(
///     inbox_runtime::observe::HANDLER_DURATION_SECONDS,
///     "inbox_handler_duration_seconds"
/// );
/// ```
pub const HANDLER_DURATION_SECONDS: &str = "inbox_handler_duration_seconds";

/// Histogram of the time until a delivery's claim was decided, in seconds,
/// label `handler` (feature `metrics`).
///
/// ```
/// assert_eq!(inbox_runtime::observe::CLAIM_WAIT_SECONDS, "inbox_claim_wait_seconds");
/// ```
pub const CLAIM_WAIT_SECONDS: &str = "inbox_claim_wait_seconds";

/// Counter of claims tried again after a lock conflict, label `handler`
/// (feature `metrics`).
///
/// ```
/// assert_eq!(inbox_runtime::observe::CLAIM_RETRIES_TOTAL, "inbox_claim_retries_total");
/// ```
pub const CLAIM_RETRIES_TOTAL: &str = "inbox_claim_retries_total";

/// Counter of rows deleted by pruning batches, labels `table` and (for a
/// batch over one handler) `handler` (feature `metrics`).
///
/// ```
/// assert_eq!(inbox_runtime::observe::PRUNED_ROWS_TOTAL, "inbox_pruned_rows_total");
/// ```
pub const PRUNED_ROWS_TOTAL: &str = "inbox_pruned_rows_total";

/// Counter of outgoing messages the broker confirmed, label `destination`
/// (feature `metrics`).
///
/// ```
/// assert_eq!(inbox_runtime::observe::OUTBOX_PUBLISHED_TOTAL, "inbox_outbox_published_total");
/// ```
pub const OUTBOX_PUBLISHED_TOTAL: &str = "inbox_outbox_published_total";

/// Counter of publishes the broker refused, labels `destination` and
/// `dead` (`true` for the refusal that made the message dead) (feature
/// `metrics`).
///
/// ```
/// assert_eq!(inbox_runtime::observe::OUTBOX_REFUSED_TOTAL, "inbox_outbox_refused_total");
/// ```
pub const OUTBOX_REFUSED_TOTAL: &str = "inbox_outbox_refused_total";

/// Counter of messages a relay gave back because the broker could not take
/// them (feature `metrics`).
///
/// ```
/// assert_eq!(inbox_runtime::observe::OUTBOX_UNAVAILABLE_TOTAL, "inbox_outbox_unavailable_total");
/// ```
pub const OUTBOX_UNAVAILABLE_TOTAL: &str = "inbox_outbox_unavailable_total";

/// Histogram of the time from an outgoing message's recording (in its
/// transaction, by the database's clock) to the broker's confirmation (by
/// the relay's clock), in seconds, label `destination` (feature `metrics`).
///
/// ```
/// assert_eq!(inbox_runtime::observe::OUTBOX_PUBLISH_DELAY_SECONDS, "inbox_outbox_publish_delay_seconds");
/// ```
pub const OUTBOX_PUBLISH_DELAY_SECONDS: &str = "inbox_outbox_publish_delay_seconds";

/// How a delivery ended, as reported. The texts are read by the `tracing`
/// events only.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) enum Ending<'a> {
    /// The body ran and its effects committed.
    Processed,
    /// The id was already claimed: the body did not run.
    Duplicate,
    /// The body failed (or panicked); `attempts` is the failed-attempt count
    /// recorded for the message, when it is known.
    Failed { attempts: Option<u32> },
    /// The body rejected the message (for `reason`); it is recorded as dead.
    Rejected { reason: &'a str },
    /// The attempt that exhausted the message's attempts (failing with
    /// `last_error`); it is recorded as dead.
    Dead { attempts: u32, last_error: &'a str },
    /// The message id is invalid: nothing ran.
    InvalidId,
    /// The id was processed with a different payload (fingerprint): the
    /// body did not run.
    Conflict { error: &'a dyn fmt::Display },
    /// The message cannot be handled as it is (its payload cannot be
    /// fingerprinted, its stored result cannot be read back): the body did
    /// not run.
    Refused { error: &'a dyn fmt::Display },
    /// The inbox's own database work failed (begin, claim, commit, rollback).
    DatabaseError { error: &'a dyn fmt::Display },
    /// The handler's scope is declared by another handler too
    /// ([`InboxError::SharedScope`]): nothing ran, the message is to be
    /// redelivered once the deploy is fixed.
    SharedScope { error: &'a dyn fmt::Display },
    /// Another delivery of the id was in flight past the claim's bound
    /// ([`InboxError::InProgress`]): nothing ran, redeliver later.
    InProgress { error: &'a dyn fmt::Display },
}

impl Ending<'_> {
    /// The outcome's name: the `inbox.outcome` field, the `outcome` label.
    #[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            Ending::Processed => "processed",
            Ending::Duplicate => "duplicate",
            Ending::Failed { .. } => "failed",
            Ending::Rejected { .. } => "rejected",
            Ending::Dead { .. } => "dead",
            Ending::InvalidId => "invalid_id",
            Ending::Conflict { .. } => "conflict",
            Ending::Refused { .. } => "refused",
            Ending::DatabaseError { .. } => "database_error",
            Ending::SharedScope { .. } => "shared_scope",
            Ending::InProgress { .. } => "in_progress",
        }
    }

    /// Whether the delivery failed (OpenTelemetry's `error.type` is set).
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) fn is_failure(&self) -> bool {
        !matches!(self, Ending::Processed | Ending::Duplicate)
    }

    /// The failed attempts recorded for the message, when known.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) fn attempts(&self) -> Option<u32> {
        match self {
            Ending::Failed { attempts } => *attempts,
            Ending::Dead { attempts, .. } => Some(*attempts),
            _ => None,
        }
    }
}

impl fmt::Debug for Ending<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.outcome())
    }
}

/// How long a delivery took, when a feature reads it.
#[cfg(any(feature = "tracing", feature = "metrics"))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// From the start of the delivery to its end.
    pub(crate) duration: Duration,
    /// From the start of the delivery until its claim was decided.
    pub(crate) claim_wait: Option<Duration>,
}

/// The clock of a delivery, started only when a feature reads it.
#[cfg(any(feature = "tracing", feature = "metrics"))]
#[derive(Debug)]
struct Clock {
    started: Instant,
    claim_wait: Option<Duration>,
}

/// One delivery being handled, from before the claim to its end. Without
/// the features it is empty, and every method does nothing.
#[derive(Debug)]
pub(crate) struct Delivery {
    /// `None` when nothing reads the time (only `tracing`, and no subscriber
    /// wants the span).
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    clock: Option<Clock>,
    #[cfg(feature = "tracing")]
    span: ::tracing::Span,
}

impl Delivery {
    /// A delivery of `key` starts.
    #[inline]
    pub(crate) fn start(key: &ClaimKey) -> Delivery {
        Delivery::begin(key.handler(), key.message_id())
    }

    #[inline]
    fn begin(handler: &HandlerName, message_id: &str) -> Delivery {
        let _ = (handler, message_id);
        #[cfg(feature = "tracing")]
        let span = tracing::span(handler, message_id);
        Delivery {
            #[cfg(any(feature = "tracing", feature = "metrics"))]
            clock: {
                #[cfg(feature = "tracing")]
                let timed = cfg!(feature = "metrics") || !span.is_disabled();
                #[cfg(not(feature = "tracing"))]
                let timed = true;
                timed.then(|| Clock {
                    started: Instant::now(),
                    claim_wait: None,
                })
            },
            #[cfg(feature = "tracing")]
            span,
        }
    }

    /// A claim of `key` lost a lock conflict and is tried again: `next_try`
    /// is the number of the try about to start (2 for the first retry).
    #[inline]
    pub(crate) fn claim_retry(&self, key: &ClaimKey, next_try: u32, error: &diesel::result::Error) {
        let _ = (key, next_try, error);
        #[cfg(feature = "tracing")]
        tracing::claim_retry(&self.span, next_try, error);
        #[cfg(feature = "metrics")]
        metrics::claim_retry(key.handler());
    }

    /// The claim was decided (claimed or duplicate).
    #[inline]
    pub(crate) fn claimed(&mut self) {
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        if let Some(clock) = &mut self.clock {
            clock.claim_wait = Some(clock.started.elapsed());
        }
    }

    /// What runs a part of the delivery (the claim, the body, the commit)
    /// inside its span.
    #[inline]
    pub(crate) fn scope(&self) -> BodyScope {
        BodyScope {
            #[cfg(feature = "tracing")]
            span: self.span.clone(),
        }
    }

    /// The delivery of `key` ended.
    #[inline]
    pub(crate) fn finish(self, key: &ClaimKey, ending: Ending<'_>) {
        self.end(key.handler(), key.message_id(), ending);
    }

    #[inline]
    fn end(self, handler: &HandlerName, message_id: &str, ending: Ending<'_>) {
        let _ = (handler, message_id, ending);
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        let timing = self.clock.map(|clock| Timing {
            duration: clock.started.elapsed(),
            claim_wait: clock.claim_wait,
        });
        #[cfg(feature = "tracing")]
        tracing::finish(self.span, handler, message_id, &ending, timing);
        #[cfg(feature = "metrics")]
        metrics::delivered(handler, &ending, timing);
    }
}

/// Runs futures inside a delivery's span (feature `tracing`); without it, a
/// future runs as it is. The code `#[idempotent]` generates for an `async
/// fn` runs the body with it (`__private::observed`); not an API of its own.
///
/// ```
/// fn polled_in_the_span<F: Future>(scope: inbox_runtime::observe::BodyScope, body: F) -> impl Future<Output = F::Output> {
///     scope.instrument(body)
/// }
/// ```
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct BodyScope {
    #[cfg(feature = "tracing")]
    span: ::tracing::Span,
}

impl BodyScope {
    /// Outside any delivery's span.
    pub(crate) fn none() -> BodyScope {
        BodyScope {
            #[cfg(feature = "tracing")]
            span: ::tracing::Span::none(),
        }
    }

    /// `future`, polled inside the delivery's span.
    ///
    /// ```
    /// fn polled_in_the_span<F: Future>(scope: inbox_runtime::observe::BodyScope, body: F) -> impl Future<Output = F::Output> {
    ///     scope.instrument(body)
    /// }
    /// ```
    #[inline]
    pub fn instrument<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        #[cfg(feature = "tracing")]
        let future = ::tracing::Instrument::instrument(future, self.span);
        future
    }

    /// Runs `f` inside the delivery's span (a synchronous step between two
    /// awaits: encoding a result to store).
    #[inline]
    pub(crate) fn in_scope<T>(&self, f: impl FnOnce() -> T) -> T {
        #[cfg(feature = "tracing")]
        let _entered = self.span.enter();
        f()
    }
}

/// How a delivery that failed with the inbox's own `error` ended.
pub(crate) fn ending_of_inbox_error(error: &InboxError) -> Ending<'_> {
    match error {
        InboxError::InvalidMessageId { .. } => Ending::InvalidId,
        error @ InboxError::Conflict(_) => Ending::Conflict { error },
        error @ (InboxError::InvalidFingerprint { .. } | InboxError::StoredResult { .. }) => {
            Ending::Refused { error }
        }
        error @ InboxError::SharedScope { .. } => Ending::SharedScope { error },
        error @ InboxError::InProgress { .. } => Ending::InProgress { error },
        error => Ending::DatabaseError { error },
    }
}

/// A handler was called with a message id (or handler name) that does not
/// make a key: reported as an `invalid_id` delivery of the handler named in
/// `error`, if it names a valid one.
#[inline]
pub(crate) fn invalid_key(error: &InboxError) {
    let _ = error;
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    if let InboxError::InvalidMessageId {
        handler,
        message_id,
        ..
    } = error
    {
        if let Ok(handler) = HandlerName::new(handler.clone()) {
            Delivery::begin(&handler, message_id).end(&handler, message_id, Ending::InvalidId);
        }
    }
}

/// A delivery of `key` refused before its claim (its payload could not be
/// fingerprinted): reported as a `refused` delivery.
pub(crate) fn refused(key: &ClaimKey, error: &InboxError) {
    Delivery::start(key).finish(key, Ending::Refused { error });
}

/// A delivery of `key` refused because its scope is shared
/// ([`InboxError::SharedScope`]): reported as a `shared_scope` delivery.
pub(crate) fn shared_scope(key: &ClaimKey, error: &InboxError) {
    Delivery::start(key).finish(key, Ending::SharedScope { error });
}

/// The first delivery of the process found scopes declared by more than one
/// handler ([`registry::check`](crate::registry::check)): reported once, as
/// the `inbox.shared_scopes` event (`ERROR`) and through `log`.
#[cold]
pub(crate) fn shared_scopes(scopes: usize, report: &dyn fmt::Display) {
    let _ = (scopes, report);
    #[cfg(feature = "tracing")]
    tracing::shared_scopes(scopes, report);
    #[cfg(feature = "log")]
    ::log::error!(target: TARGET, "{report}");
}

/// What [`claim_token_missing`] reports.
#[cfg(any(feature = "tracing", feature = "log"))]
const CLAIM_TOKEN_MISSING: &str = "the inbox has no claim_token column (MySQL/MariaDB: \
     the migration 2026-12-08-000000_claim_token has not run, nor setup() since): deliveries \
     guard their transactions with a savepoint instead, three more round trips each; run the \
     migration";

/// A claim found the inbox without the claim token's column (MySQL/MariaDB,
/// an inbox whose migration has not run): the delivery claims again
/// without it, and the process reports why once, as the
/// `inbox.claim_token_missing` event (`WARN`) and through `log`.
#[cold]
pub(crate) fn claim_token_missing() {
    #[cfg(any(feature = "tracing", feature = "log"))]
    {
        static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            #[cfg(feature = "tracing")]
            tracing::claim_token_missing(CLAIM_TOKEN_MISSING);
            #[cfg(feature = "log")]
            ::log::warn!(target: TARGET, "{CLAIM_TOKEN_MISSING}");
        }
    }
}

/// A pruning run found rows of scopes that no registered handler declares
/// (see [`Prune::warn_unregistered`](crate::Prune::warn_unregistered)):
/// reported once per run, as the `inbox.unregistered_scopes` event (`WARN`)
/// and through `log`.
pub(crate) fn unregistered_scopes(scopes: &[String]) {
    let _ = scopes;
    #[cfg(any(feature = "tracing", feature = "log"))]
    if !scopes.is_empty() {
        let list = scopes.join(", ");
        #[cfg(feature = "tracing")]
        tracing::unregistered_scopes(scopes.len(), &list);
        #[cfg(feature = "log")]
        ::log::warn!(
            target: TARGET,
            "the inbox holds ids of {} scope{} that no handler of this program declares \
             (renamed or removed handlers, kept until the retention window passes): {list}",
            scopes.len(),
            if scopes.len() == 1 { "" } else { "s" },
        );
    }
}

/// A pruning batch deleted `rows` rows of `table` (`inbox_messages` or
/// `inbox_failures`); `handler` when the batch pruned one handler only.
#[inline]
pub(crate) fn pruned(table: &'static str, handler: Option<&str>, rows: u64) {
    let _ = (table, handler, rows);
    #[cfg(feature = "tracing")]
    tracing::pruned(table, handler, rows);
    #[cfg(feature = "metrics")]
    metrics::pruned(table, handler, rows);
}

/// What a relay round did to one message, as observed.
#[derive(Clone, Copy)]
#[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
pub(crate) enum Relayed<'a> {
    /// The broker confirmed it; it was recorded at `created_micros` (the
    /// database's clock, microseconds since the Unix epoch: read by the
    /// `metrics` feature only).
    Published {
        #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
        created_micros: i64,
    },
    /// The broker refused it; `dead` when that was its last attempt
    /// (`reason`: read by the `tracing` feature only).
    Refused {
        dead: bool,
        #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
        reason: &'a str,
    },
    /// The broker could not take it: given back uncounted.
    Unavailable,
}

/// A relay round's answer for a message bound for `destination`.
#[inline]
pub(crate) fn relayed(destination: &str, relayed: Relayed<'_>) {
    let _ = (destination, relayed);
    #[cfg(feature = "tracing")]
    tracing::relayed(destination, relayed);
    #[cfg(feature = "metrics")]
    metrics::relayed(destination, relayed);
}

/// The time from a message's recording to now, by the two clocks it takes
/// (the database's at recording, this process's now): never negative.
#[cfg(feature = "metrics")]
fn since_recorded(created_micros: i64) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
        });
    Duration::from_micros(u64::try_from(now.saturating_sub(created_micros)).unwrap_or(0))
}
