//! Handling a batch of messages in one transaction with one claim
//! statement: what a consumer that receives messages in batches (Kafka,
//! NATS, SQS) runs instead of one transaction per message.
//!
//! The split around failed messages is written once ([`Run::drive`]), as an
//! `async fn` over how one transaction and one lone message execute
//! ([`Execute`]); so are the transaction's claims and commit
//! ([`attempt`], over the delivery core's executors) and the bodies' runs
//! ([`bodies`], async closures). [`blocking`] drives it without a runtime
//! (every step is ready when first polled) and [`asynchronous`] on
//! diesel-async connections: they hold only the public functions.

use std::collections::HashSet;
use std::future::Future;

use crate::ack::{Found, classify, trouble_recovery};
use crate::claim::Claim;
use crate::error::Recovery;
use crate::error::{HandlerError, InboxError, into_handler_error};
use crate::execution::retry::Tries;
use crate::failure::Failure;
use crate::key::{ClaimKey, HandlerName};
use crate::message_id::MessageId;
use crate::observe::{self, Delivery, Ending};
use crate::outcome::Outcome;
use crate::recovery::is_refused_key_text;
use crate::scope::{Scope, either, report_after_failed_rollback};

#[cfg(feature = "async")]
mod asynchronous;
mod attempt;
mod blocking;
mod bodies;

#[cfg(feature = "async")]
pub use asynchronous::{
    run_idempotent_batch_async, run_idempotent_batch_async_with, run_idempotent_batch_bulk_async,
    run_idempotent_batch_bulk_async_with,
};
pub use blocking::{
    run_idempotent_batch, run_idempotent_batch_bulk, run_idempotent_batch_bulk_with,
    run_idempotent_batch_with,
};

/// The most messages one batch transaction holds: a longer batch is run as
/// consecutive transactions of at most this many messages (in the order
/// given), never refused. Each transaction's claim is split into statements
/// of at most the backend's bound of parameters.
///
/// ```
/// assert_eq!(inbox_runtime::MAX_BATCH_MESSAGES, 1000);
/// ```
pub const MAX_BATCH_MESSAGES: usize = 1000;

/// The result of every message of a batch, in the order the messages were
/// given: `Ok(Outcome::Processed(value))`, `Ok(Outcome::Duplicate)`, or the
/// error of that message, which [`ack_decision`](crate::ack_decision)
/// turns into the broker's decision for it.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{HandlerName, Outcome, run_idempotent_batch};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let handler = HandlerName::new("greeter")?;
/// let report = run_idempotent_batch(&mut conn, &handler, &["a", "b", "a"], |id| *id, |_conn, id| {
///     diesel::QueryResult::Ok(id.len())
/// });
/// assert_eq!((report.len(), report.processed(), report.duplicates(), report.failed()), (3, 2, 1, 0));
/// assert!(matches!(report.results()[2], Ok(Outcome::Duplicate)), "a copy inside the batch");
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[must_use = "each message of the batch must be acknowledged by its own result"]
pub struct BatchReport<T, E> {
    results: Vec<Result<Outcome<T>, E>>,
}

impl<T, E> BatchReport<T, E> {
    /// The results, one per message, in the order the messages were given.
    ///
    /// ```
    /// # fn show(report: &inbox_runtime::BatchReport<(), inbox_runtime::InboxError>) {
    /// for (position, result) in report.results().iter().enumerate() {
    ///     println!("message {position}: {:?}", inbox_runtime::ack_decision(result));
    /// }
    /// # }
    /// ```
    pub fn results(&self) -> &[Result<Outcome<T>, E>] {
        &self.results
    }

    /// The results, owned.
    ///
    /// ```
    /// # fn take(report: inbox_runtime::BatchReport<u32, inbox_runtime::InboxError>) -> usize {
    /// report.into_results().into_iter().filter(Result::is_ok).count()
    /// # }
    /// ```
    pub fn into_results(self) -> Vec<Result<Outcome<T>, E>> {
        self.results
    }

    /// How many messages the batch had.
    ///
    /// ```
    /// # fn size(report: &inbox_runtime::BatchReport<(), inbox_runtime::InboxError>) -> usize {
    /// report.len()
    /// # }
    /// ```
    pub fn len(&self) -> usize {
        self.results.len()
    }

    /// Whether the batch had no messages.
    ///
    /// ```
    /// # fn none(report: &inbox_runtime::BatchReport<(), inbox_runtime::InboxError>) -> bool {
    /// report.is_empty()
    /// # }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.results.is_empty()
    }

    /// How many messages were processed (their effects committed now).
    ///
    /// ```
    /// # fn done(report: &inbox_runtime::BatchReport<(), inbox_runtime::InboxError>) -> usize {
    /// report.processed()
    /// # }
    /// ```
    pub fn processed(&self) -> usize {
        self.count(|result| matches!(result, Ok(Outcome::Processed(_))))
    }

    /// How many messages were duplicates (already claimed, or a copy of an
    /// earlier message of the same batch): their bodies did not run.
    ///
    /// ```
    /// # fn again(report: &inbox_runtime::BatchReport<(), inbox_runtime::InboxError>) -> usize {
    /// report.duplicates()
    /// # }
    /// ```
    pub fn duplicates(&self) -> usize {
        self.count(|result| matches!(result, Ok(Outcome::Duplicate)))
    }

    /// How many messages ended with an error.
    ///
    /// ```
    /// # fn failed(report: &inbox_runtime::BatchReport<(), inbox_runtime::InboxError>) -> usize {
    /// report.failed()
    /// # }
    /// ```
    pub fn failed(&self) -> usize {
        self.count(Result::is_err)
    }

    fn count(&self, counted: impl Fn(&Result<Outcome<T>, E>) -> bool) -> usize {
        self.results.iter().filter(|result| counted(result)).count()
    }
}

/// A message of the batch still to be handled.
pub(crate) struct Pending<'m, M> {
    /// Its position in the batch.
    index: usize,
    pub(crate) key: ClaimKey,
    pub(crate) message: &'m M,
}

/// How one transaction over some of the batch's messages went.
pub(crate) enum Attempt<E> {
    /// It committed: what each message's claim said, by position in the
    /// transaction's messages (the values of the processed ones were pushed
    /// in that order).
    Committed(Vec<Claim>),
    /// The body failed (or panicked) on the message at this position, and
    /// the transaction was rolled back.
    BodyFailed(usize),
    /// The transaction failed for a reason that belongs to one of the
    /// messages but does not say which (a bulk body failed; the commit was
    /// refused because a body ignored a failed statement, or a deferred
    /// constraint), and was rolled back on a connection that is still
    /// sound: the batch is split in two.
    Halve,
    /// The database refused the text of the id at this position, or the
    /// claim of its id gave up waiting for a delivery in flight: the
    /// transaction was rolled back, and this is the message's error.
    Refused(usize, InboxError),
    /// Database trouble, met with the message at this position; the
    /// transaction was rolled back (or is lost). Then the positions of the
    /// messages whose claims found their ids claimed before (committed by
    /// other deliveries: still duplicates), if the claims were made.
    Trouble(usize, E, Vec<usize>),
}

/// How the messages of a batch execute on one connection: blocking or
/// async.
pub(crate) trait Execute<M, T, E> {
    /// One transaction over `batch` (at least two messages): claims every
    /// id, runs the body of the new ones in order (pushing their values to
    /// `values`), commits.
    fn attempt(
        &mut self,
        batch: &[&Pending<'_, M>],
        values: &mut Vec<T>,
    ) -> impl Future<Output = Attempt<E>>;

    /// One message on its own, exactly as the single form runs it (a panic
    /// is resumed).
    fn alone(&mut self, pending: &Pending<'_, M>) -> impl Future<Output = Result<Outcome<T>, E>>;

    /// Whether the connection's transaction manager is broken (a lost
    /// transaction, a failed rollback, a cancelled level): the connection
    /// must be replaced, whatever an error shows through its wrappers.
    fn is_broken(&mut self) -> bool;

    /// Marks the connection broken when `error` left it unusable (see
    /// [`leave_broken_if_unusable`](crate::execution::leave_broken_if_unusable)).
    fn leave_broken_if_unusable(&mut self, error: &E);
}

/// A batch being handled: the results so far.
pub(crate) struct Run<T, E> {
    results: Vec<Option<Result<Outcome<T>, E>>>,
    /// Set when database trouble stopped the run: the id of the message
    /// whose result carries the error, and what to do about it.
    stopped: Option<(String, Recovery)>,
}

impl<T, E: HandlerError> Run<T, E> {
    /// Handles `messages` with `exec`: validates the ids, then runs the
    /// batch in transactions of at most [`MAX_BATCH_MESSAGES`], splitting
    /// around failed messages.
    pub(crate) async fn drive<M, I, X>(
        exec: &mut X,
        handler: &HandlerName,
        messages: &[M],
        id_of: impl Fn(&M) -> &I,
    ) -> BatchReport<T, E>
    where
        I: MessageId + ?Sized,
        X: Execute<M, T, E>,
    {
        let mut run = Run {
            results: messages.iter().map(|_| None).collect(),
            stopped: None,
        };
        let pending = run.keys(handler, messages, &id_of);
        for chunk in pending.chunks(MAX_BATCH_MESSAGES) {
            run.process(exec, chunk.iter().collect()).await;
        }
        BatchReport {
            results: run
                .results
                .into_iter()
                .map(|result| result.expect("every message of the batch has a result"))
                .collect(),
        }
    }

    /// Validates the ids: the invalid ones and the copies of an earlier id
    /// get their results now; the rest are returned in batch order.
    fn keys<'m, M, I>(
        &mut self,
        handler: &HandlerName,
        messages: &'m [M],
        id_of: &impl Fn(&M) -> &I,
    ) -> Vec<Pending<'m, M>>
    where
        I: MessageId + ?Sized,
    {
        let mut valid = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            match ClaimKey::new(handler.clone(), id_of(message)) {
                Ok(key) => valid.push(Pending {
                    index,
                    key,
                    message,
                }),
                Err(error) => {
                    observe::invalid_key(&error);
                    self.results[index] = Some(Err(into_handler_error(error)));
                }
            }
        }
        let mut by_id: Vec<usize> = (0..valid.len()).collect();
        by_id.sort_by(|a, b| valid[*a].key.message_id().cmp(valid[*b].key.message_id()));
        let mut copies = vec![false; valid.len()];
        for pair in by_id.windows(2) {
            // The sort is stable: the first copy comes first.
            if valid[pair[0]].key.message_id() == valid[pair[1]].key.message_id() {
                copies[pair[1]] = true;
            }
        }
        valid
            .into_iter()
            .zip(copies)
            .filter_map(|(pending, copy)| {
                if copy {
                    Delivery::start(&pending.key).finish(&pending.key, Ending::Duplicate);
                    self.results[pending.index] = Some(Ok(Outcome::Duplicate));
                    None
                } else {
                    Some(pending)
                }
            })
            .collect()
    }

    /// Handles `batch` (in order) in as few transactions as its failures
    /// allow: a stack of segments still to run, the next on top.
    async fn process<M, X>(&mut self, exec: &mut X, batch: Vec<&Pending<'_, M>>)
    where
        X: Execute<M, T, E>,
    {
        let mut segments = vec![batch];
        while let Some(mut batch) = segments.pop() {
            if batch.is_empty() {
                continue;
            }
            if let Some((cause, recovery)) = &self.stopped {
                for pending in batch {
                    let error = InboxError::BatchAborted {
                        cause_message_id: cause.clone(),
                        recovery: *recovery,
                    };
                    Delivery::start(&pending.key)
                        .finish(&pending.key, Ending::DatabaseError { error: &error });
                    self.results[pending.index] = Some(Err(into_handler_error(error)));
                }
                continue;
            }
            if let [pending] = batch[..] {
                let result = exec.alone(pending).await;
                if let Err(error) = &result {
                    if is_trouble(error) {
                        self.stop(exec, pending, error);
                    }
                }
                self.results[pending.index] = Some(result);
                continue;
            }
            let mut values = Vec::new();
            match exec.attempt(&batch, &mut values).await {
                Attempt::Committed(claims) => {
                    let mut values = values.into_iter();
                    for (pending, claim) in batch.iter().zip(claims) {
                        let outcome = match claim {
                            Claim::Claimed => Outcome::Processed(
                                values.next().expect("a value per processed message"),
                            ),
                            Claim::Duplicate => Outcome::Duplicate,
                        };
                        self.results[pending.index] = Some(Ok(outcome));
                    }
                }
                Attempt::BodyFailed(position) => {
                    // The messages before it commit on their own, then it
                    // runs alone, then the messages after it.
                    let after = batch.split_off(position + 1);
                    let failed = batch.pop().expect("the failed message");
                    segments.extend([after, vec![failed], batch]);
                }
                Attempt::Halve => {
                    // Halves, until the message that broke the transaction
                    // runs alone (the single form's rules); the others
                    // commit.
                    let second = batch.split_off(batch.len() / 2);
                    segments.extend([second, batch]);
                }
                Attempt::Refused(position, error) => {
                    let refused = batch.remove(position);
                    match &error {
                        InboxError::InProgress { .. } => Delivery::start(&refused.key)
                            .finish(&refused.key, observe::ending_of_inbox_error(&error)),
                        _ => observe::invalid_key(&error),
                    }
                    self.results[refused.index] = Some(Err(into_handler_error(error)));
                    segments.push(batch);
                }
                Attempt::Trouble(position, error, duplicates) => {
                    let pending = batch[position];
                    Delivery::start(&pending.key)
                        .finish(&pending.key, Ending::DatabaseError { error: &error });
                    self.stop(exec, pending, &error);
                    self.results[pending.index] = Some(Err(error));
                    for &duplicate in &duplicates {
                        let pending = batch[duplicate];
                        Delivery::start(&pending.key).finish(&pending.key, Ending::Duplicate);
                        self.results[pending.index] = Some(Ok(Outcome::Duplicate));
                    }
                    // The others are aborted.
                    let aborted = batch
                        .into_iter()
                        .enumerate()
                        .filter(|(at, _)| *at != position && !duplicates.contains(at))
                        .map(|(_, pending)| pending)
                        .collect();
                    segments.push(aborted);
                }
            }
        }
    }

    /// Database trouble met with `pending` stops the run. A broken
    /// connection means `Reconnect`, also when a wrapper that forwards
    /// `source()` (`#[error(transparent)]`) shows a lost transaction's
    /// cause instead of the loss.
    fn stop<M, X: Execute<M, T, E>>(&mut self, exec: &mut X, pending: &Pending<'_, M>, error: &E) {
        exec.leave_broken_if_unusable(error);
        let recovery = match exec.is_broken() {
            true => Recovery::Reconnect,
            false => trouble_recovery(error),
        };
        self.stopped = Some((pending.key.message_id().to_owned(), recovery));
    }
}

/// Why the claims of a batch were not made.
pub(crate) enum ClaimFailure {
    /// The database refused the id at this position (the level is rolled
    /// back).
    Refused(usize, InboxError),
    /// Database trouble (the level is rolled back, or lost).
    Trouble(InboxError),
}

impl ClaimFailure {
    /// The error.
    pub(crate) fn into_error(self) -> InboxError {
        match self {
            ClaimFailure::Refused(_, error) | ClaimFailure::Trouble(error) => error,
        }
    }
}

/// How a batch's claims are made in a try: in batch statements, or id by
/// id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimMode {
    /// One statement per at most `MAX_CLAIMS_PER_STATEMENT` ids.
    Statements,
    /// One statement per id: the backend could not tell which ids a batch
    /// statement inserted, or the database refused one id's text.
    OneByOne,
}

/// After a try of the claims that did not claim (`failure`: `None` when the
/// statement could not tell which ids it inserted) and was rolled back:
/// how to try again, or the failure to give up with.
pub(crate) fn next_claim_mode(
    failure: Option<ClaimFailure>,
    mode: ClaimMode,
    scope: &Scope,
    tries: &mut Tries,
) -> Result<ClaimMode, ClaimFailure> {
    match failure {
        None => Ok(ClaimMode::OneByOne),
        // A refused text: which id it was, only single claims tell.
        Some(ClaimFailure::Trouble(InboxError::Database(cause)))
            if mode == ClaimMode::Statements && is_refused_key_text(&cause) =>
        {
            Ok(ClaimMode::OneByOne)
        }
        // Claims retry at once (the policy's wait is zero).
        Some(ClaimFailure::Trouble(InboxError::Database(cause)))
            if scope.is_outermost() && tries.again(&cause).is_some() =>
        {
            Ok(mode)
        }
        Some(failure) => Err(failure),
    }
}

/// The distinct ids of `batch`, sorted: the order every batch claims in.
pub(crate) fn sorted_ids<'b, M>(batch: &'b [&Pending<'_, M>]) -> Vec<&'b str> {
    let mut ids: Vec<&str> = batch.iter().map(|p| p.key.message_id()).collect();
    ids.sort_unstable();
    ids
}

/// The positions of `batch` in the order of their ids.
pub(crate) fn sorted_positions<M>(batch: &[&Pending<'_, M>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_unstable_by(|a, b| batch[*a].key.message_id().cmp(batch[*b].key.message_id()));
    order
}

/// The messages of `batch` whose ids were claimed, in order.
pub(crate) fn claimed<'b, 'm, M>(
    batch: &'b [&'b Pending<'m, M>],
    claims: &[Claim],
) -> Vec<&'b Pending<'m, M>> {
    batch
        .iter()
        .zip(claims)
        .filter(|(_, claim)| **claim == Claim::Claimed)
        .map(|(pending, _)| *pending)
        .collect()
}

/// Each message's claim, from the ids the statements inserted.
pub(crate) fn claims_of<M>(batch: &[&Pending<'_, M>], inserted: &HashSet<String>) -> Vec<Claim> {
    batch
        .iter()
        .map(|p| match inserted.contains(p.key.message_id()) {
            true => Claim::Claimed,
            false => Claim::Duplicate,
        })
        .collect()
}

/// The error of a refused id (or of one whose delivery is in flight) met in
/// a one-by-one claim, as the failure to report: that message's own answer,
/// while the others go on.
pub(crate) fn one_by_one_failure(position: usize, error: InboxError) -> ClaimFailure {
    if error.is_invalid_message() || matches!(error, InboxError::InProgress { .. }) {
        ClaimFailure::Refused(position, error)
    } else {
        ClaimFailure::Trouble(error)
    }
}

/// How a try of the claims that could not claim ends the transaction's
/// attempt.
pub(crate) fn attempt_after_claims_failed<E: HandlerError>(failure: ClaimFailure) -> Attempt<E> {
    match failure {
        ClaimFailure::Refused(position, error) => Attempt::Refused(position, error),
        ClaimFailure::Trouble(error) => Attempt::Trouble(0, into_handler_error(error), Vec::new()),
    }
}

/// What a failed body left: its error, or its panic.
pub(crate) enum BodyFailure<E> {
    /// The body returned this error.
    Error(E),
    /// The body panicked with this payload.
    Panic(Box<dyn std::any::Any + Send>),
}

/// How a failed body ends the transaction's attempt, once its level's
/// rollback was tried (`rolled_back`): `at` is the position of the message
/// it failed on, when the body runs per message (`None`: a bulk body, which
/// does not say). A panic is resumed at once when the rollback failed (the
/// connection is lost, and the panic matters more).
pub(crate) fn attempt_after_body_failure<E: HandlerError>(
    at: Option<usize>,
    failure: BodyFailure<E>,
    rolled_back: Result<(), InboxError>,
    claims: &[Claim],
) -> Attempt<E> {
    let position = at.unwrap_or_else(|| first_claimed(claims));
    let error = match failure {
        BodyFailure::Panic(panic) if rolled_back.is_err() => std::panic::resume_unwind(panic),
        // Alone, the message panics again (or not), and is counted as the
        // single form counts it.
        BodyFailure::Panic(_) => return at.map_or(Attempt::Halve, Attempt::BodyFailed),
        BodyFailure::Error(error) => error,
    };
    if let Err(rollback_error) = rolled_back {
        let error =
            report_after_failed_rollback(error, rollback_error).unwrap_or_else(into_handler_error);
        return trouble_after_claims(position, error, claims);
    }
    match is_trouble(&error) {
        true => trouble_after_claims(position, error, claims),
        false => at.map_or(Attempt::Halve, Attempt::BodyFailed),
    }
}

/// The position of the first message whose id was claimed (0 if none was).
fn first_claimed(claims: &[Claim]) -> usize {
    claims
        .iter()
        .position(|claim| *claim == Claim::Claimed)
        .unwrap_or(0)
}

/// How the transaction's attempt ends after its commit: reports every
/// delivery when it committed. A commit refused on a connection that is
/// still sound (`broken`: whether its transaction manager is broken now),
/// neither for a lost connection nor for a lock conflict, is the batch's
/// to split.
pub(crate) fn attempt_after_commit<M, E: HandlerError>(
    committed: Result<(), InboxError>,
    broken: bool,
    deliveries: Vec<Delivery>,
    batch: &[&Pending<'_, M>],
    claims: Vec<Claim>,
) -> Attempt<E> {
    if let Err(error) = committed {
        let lock_conflict =
            matches!(&error, InboxError::Database(cause) if crate::is_lock_conflict(cause));
        if !broken && !lock_conflict && error.recovery() == Recovery::Retry {
            return Attempt::Halve;
        }
        let position = first_claimed(&claims);
        return trouble_after_claims(position, into_handler_error(error), &claims);
    }
    for ((delivery, pending), claim) in deliveries.into_iter().zip(batch).zip(&claims) {
        let ending = match claim {
            Claim::Claimed => Ending::Processed,
            Claim::Duplicate => Ending::Duplicate,
        };
        delivery.finish(&pending.key, ending);
    }
    Attempt::Committed(claims)
}

/// A try of the claims failed (`failure`; `None`: the statement could not
/// tell which ids it inserted), then so did its rollback: the level is
/// lost.
pub(crate) fn lost_after_claims(
    failure: Option<ClaimFailure>,
    rollback_error: InboxError,
) -> ClaimFailure {
    let cause = failure.map_or(
        InboxError::Database(diesel::result::Error::RollbackTransaction),
        ClaimFailure::into_error,
    );
    ClaimFailure::Trouble(either(report_after_failed_rollback(cause, rollback_error)))
}

/// Database trouble met with the message at `position`, once the claims of
/// the transaction were made.
pub(crate) fn trouble_after_claims<E>(position: usize, error: E, claims: &[Claim]) -> Attempt<E> {
    let duplicates = (0..claims.len())
        .filter(|at| *at != position && claims[*at] == Claim::Duplicate)
        .collect();
    Attempt::Trouble(position, error, duplicates)
}

/// Whether a body's error is database trouble, which says nothing about the
/// message (a lost connection, a lock conflict): not counted, and the batch
/// stops.
pub(crate) fn is_trouble<E: HandlerError>(error: &E) -> bool {
    Failure::of_error(error).is_none() && !matches!(classify(error), Found::Final)
}
