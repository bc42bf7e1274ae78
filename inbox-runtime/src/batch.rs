//! Handling a batch of messages in one transaction with one claim
//! statement: what a consumer that receives messages in batches (Kafka,
//! NATS, SQS) runs instead of one transaction per message.

use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};

use diesel::connection::LoadConnection;

use crate::ack::{Found, classify};
use crate::attempts::{MaxAttempts, default_max_attempts};
use crate::backend::{BatchClaimed, InboxBackend};
use crate::claim::Claim;
use crate::error::{HandlerError, InboxError, into_handler_error};
use crate::execution::{RetryPolicy, require_transaction};
use crate::failure::Failure;
use crate::key::{ClaimKey, HandlerName};
use crate::message_id::MessageId;
use crate::observe::{self, Delivery, Ending};
use crate::outcome::Outcome;
use crate::recovery::{Recovery, is_refused_key_text};
use crate::scope::{Scope, either, report_after_failed_rollback};
use crate::transaction::{begin, claim_or_refuse, commit, roll_back, run_idempotent_with, status};

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

/// Handles a batch of messages exactly once each: one transaction, one
/// statement claiming every id, and `body` run on that transaction's
/// connection once per message whose id was not claimed before, in the
/// order given. The claims commit together with the bodies' effects.
///
/// The guarantees are those of [`run_idempotent`](crate::run_idempotent),
/// message by message:
///
/// - **Duplicates**: an id claimed before (also by a batch committing
///   concurrently) is `Ok(Outcome::Duplicate)` and its body does not run; a
///   copy of an id earlier in the same batch is a duplicate too, the
///   earlier copy carrying the outcome.
/// - **Invalid ids** (empty, too long, missing, not UTF-8) are that
///   message's [`InboxError::InvalidMessageId`]; the others proceed.
/// - **A body that fails** (its own error or a panic) does not sink the
///   others: the transaction rolls back, the messages before the failed one
///   run again in a transaction of their own and commit, the failed one
///   runs again **alone**, exactly as `run_idempotent_with` runs it (its
///   failed attempt is counted, and at `max_attempts` or on a rejection it
///   is dead), and the batch goes on with the messages after it. A failure
///   is only ever counted when its message failed alone, so a message is
///   never charged for another's fault. A panic is resumed once the messages
///   before it committed and its attempt was counted; the messages after it
///   are not run.
/// - **Database trouble** (a lost connection, a lock conflict in a body, a
///   failed commit): nothing of that transaction commits. The message that
///   met it gets the error, and every message of the batch not committed
///   yet gets [`InboxError::BatchAborted`] (retryable, with the same
///   [`Recovery`]); the run stops there. A claim that loses a lock conflict
///   is retried first, as `run_idempotent` retries it. Duplicates keep
///   `Ok(Outcome::Duplicate)`: their ids were committed by other deliveries.
/// - **Size**: any number of messages. A transaction holds at most
///   [`MAX_BATCH_MESSAGES`]; a longer batch is run as several, in order.
///   Each claim statement stays under its backend's parameter limit.
/// - **Concurrency**: the ids are claimed in one fixed order (sorted), so
///   overlapping batches wait for each other instead of deadlocking on
///   their claims, and an id two batches share is processed by one of them.
/// - Nested in a transaction open on `conn`, the batch is a savepoint, as
///   `run_idempotent` is, and failures are not counted.
///
/// On PostgreSQL and SQLite (3.35 or later) the claim is `INSERT …
/// ON CONFLICT DO NOTHING RETURNING message_id`. On MySQL/MariaDB it is an
/// `INSERT IGNORE`, whose affected-row count tells "all new" and "all
/// claimed before" apart; a batch mixing both is rolled back and claimed id
/// by id in a new transaction (one statement per id).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_runtime::{ack_decision, AckDecision, HandlerName, run_idempotent_batch};
///
/// struct Payment { id: String, cents: i64 }
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// conn.batch_execute("CREATE TABLE ledger (id TEXT PRIMARY KEY, cents BIGINT NOT NULL)")?;
/// let handler = HandlerName::new("billing.apply_payment")?;
/// let batch = [
///     Payment { id: "pay-1".into(), cents: 500 },
///     Payment { id: "pay-2".into(), cents: 700 },
/// ];
/// let apply = |conn: &mut SqliteConnection, payment: &Payment| {
///     diesel::sql_query("INSERT INTO ledger VALUES (?, ?)")
///         .bind::<diesel::sql_types::Text, _>(&payment.id)
///         .bind::<diesel::sql_types::BigInt, _>(payment.cents)
///         .execute(conn)
///         .map(|_| ())
/// };
/// let first = run_idempotent_batch(&mut conn, &handler, &batch, |p| &p.id, apply);
/// assert_eq!(first.processed(), 2);
/// // The broker redelivers the batch: nothing is applied twice.
/// let again = run_idempotent_batch(&mut conn, &handler, &batch, |p| &p.id, apply);
/// assert_eq!(again.duplicates(), 2);
/// assert!(again.results().iter().all(|result| ack_decision(result) == AckDecision::Ack));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_batch<C, M, I, T, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    body: F,
) -> BatchReport<T, E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: FnMut(&mut C, &M) -> Result<T, E>,
{
    run_idempotent_batch_with(conn, handler, messages, id_of, default_max_attempts(), body)
}

/// [`run_idempotent_batch`] with the handler's own limit of failed attempts
/// instead of [`default_max_attempts`].
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{ack_decision, AckDecision, HandlerName, InboxError, MaxAttempts, run_idempotent_batch_with};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let handler = HandlerName::new("orders")?;
/// let body = |_: &mut SqliteConnection, id: &&str| match *id {
///     "bad" => Err(InboxError::rejected("unknown sku")),
///     _ => Ok(()),
/// };
/// let report = run_idempotent_batch_with(&mut conn, &handler, &["a", "bad", "c"], |id| *id, MaxAttempts::limit(3), body);
/// let decisions: Vec<_> = report.results().iter().map(ack_decision).collect();
/// assert_eq!(decisions, [AckDecision::Ack, AckDecision::DeadLetter, AckDecision::Ack]);
/// assert_eq!(report.processed(), 2, "the good messages committed");
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_batch_with<C, M, I, T, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    max_attempts: MaxAttempts,
    mut body: F,
) -> BatchReport<T, E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: FnMut(&mut C, &M) -> Result<T, E>,
{
    let mut run = Run {
        results: messages.iter().map(|_| None).collect(),
        stopped: None,
        max_attempts,
    };
    let pending = run.keys(handler, messages, &id_of);
    for chunk in pending.chunks(MAX_BATCH_MESSAGES) {
        run.process(conn, chunk.iter().collect(), &mut body);
    }
    BatchReport {
        results: run
            .results
            .into_iter()
            .map(|result| result.expect("every message of the batch has a result"))
            .collect(),
    }
}

/// A message of the batch still to be handled.
struct Pending<'m, M> {
    /// Its position in the batch.
    index: usize,
    key: ClaimKey,
    message: &'m M,
}

/// A batch being handled: the results so far.
struct Run<T, E> {
    results: Vec<Option<Result<Outcome<T>, E>>>,
    /// Set when database trouble stopped the run: the id of the message
    /// whose result carries the error, and what to do about it.
    stopped: Option<(String, Recovery)>,
    max_attempts: MaxAttempts,
}

/// How one transaction over some of the batch's messages went.
enum Attempt<E> {
    /// It committed: the body's values of the claimed messages, by position
    /// in the transaction's messages, and which messages were duplicates.
    Committed(Vec<(usize, Outcome<()>)>),
    /// The body failed (or panicked) on the message at this position, and
    /// the transaction was rolled back.
    BodyFailed(usize),
    /// The database refused the text of the id at this position: the
    /// transaction was rolled back, and this is the message's error.
    Refused(usize, InboxError),
    /// Database trouble, met with the message at this position; the
    /// transaction was rolled back (or is lost).
    Trouble(usize, E),
}

impl<T, E: HandlerError> Run<T, E> {
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
            // Sorting is stable: the first copy comes first.
            if valid[pair[0]].key.message_id() == valid[pair[1]].key.message_id() {
                copies[pair[1]] = true;
            }
        }
        valid
            .into_iter()
            .zip(copies)
            .filter_map(|(pending, copy)| {
                if copy {
                    let delivery = Delivery::start(&pending.key);
                    delivery.finish(&pending.key, Ending::Duplicate);
                    self.results[pending.index] = Some(Ok(Outcome::Duplicate));
                    None
                } else {
                    Some(pending)
                }
            })
            .collect()
    }

    /// Handles `batch` (in order) in as few transactions as its failures
    /// allow.
    fn process<C, M, F>(&mut self, conn: &mut C, mut batch: Vec<&Pending<'_, M>>, body: &mut F)
    where
        C: LoadConnection,
        C::Backend: InboxBackend,
        F: FnMut(&mut C, &M) -> Result<T, E>,
    {
        while !batch.is_empty() {
            if let Some((cause, recovery)) = &self.stopped {
                let aborted = |_: &&Pending<'_, M>| InboxError::BatchAborted {
                    cause_message_id: cause.clone(),
                    recovery: *recovery,
                };
                let errors: Vec<_> = batch.iter().map(aborted).collect();
                for (pending, error) in batch.iter().zip(errors) {
                    let delivery = Delivery::start(&pending.key);
                    delivery.finish(&pending.key, Ending::DatabaseError { error: &error });
                    self.results[pending.index] = Some(Err(into_handler_error(error)));
                }
                return;
            }
            if batch.len() == 1 {
                self.alone(conn, batch[0], body);
                return;
            }
            let mut values = Vec::new();
            match self.attempt(conn, &batch, body, &mut values) {
                Attempt::Committed(outcomes) => {
                    let mut values = values.into_iter();
                    for (position, outcome) in outcomes {
                        let pending = batch[position];
                        let result = match outcome {
                            Outcome::Processed(()) => {
                                let value = values.next().expect("a value per processed message");
                                Outcome::Processed(value)
                            }
                            Outcome::Duplicate => Outcome::Duplicate,
                        };
                        self.results[pending.index] = Some(Ok(result));
                    }
                    return;
                }
                Attempt::BodyFailed(position) => {
                    let after = batch.split_off(position + 1);
                    let failed = batch.pop().expect("the failed message");
                    self.process(conn, batch, body);
                    self.process(conn, vec![failed], body);
                    batch = after;
                }
                Attempt::Refused(position, error) => {
                    let refused = batch.remove(position);
                    observe::invalid_key(&error);
                    self.results[refused.index] = Some(Err(into_handler_error(error)));
                }
                Attempt::Trouble(position, error) => {
                    let recovery = trouble_recovery(&error);
                    let pending = batch.remove(position);
                    let delivery = Delivery::start(&pending.key);
                    delivery.finish(&pending.key, Ending::DatabaseError { error: &error });
                    self.results[pending.index] = Some(Err(error));
                    self.stopped = Some((pending.key.message_id().to_owned(), recovery));
                }
            }
        }
    }

    /// One message, on its own: exactly what `run_idempotent_with` does.
    fn alone<C, M, F>(&mut self, conn: &mut C, pending: &Pending<'_, M>, body: &mut F)
    where
        C: LoadConnection,
        C::Backend: InboxBackend,
        F: FnMut(&mut C, &M) -> Result<T, E>,
    {
        let result = run_idempotent_with(conn, pending.key.clone(), self.max_attempts, |conn| {
            body(conn, pending.message).map(Outcome::Processed)
        });
        if let Err(error) = &result {
            if is_trouble(error) {
                let recovery = trouble_recovery(error);
                self.stopped = Some((pending.key.message_id().to_owned(), recovery));
            }
        }
        self.results[pending.index] = Some(result);
    }

    /// One transaction over `batch`: claims every id, runs the body of the
    /// new ones (their values pushed to `values`), commits.
    fn attempt<C, M, F>(
        &mut self,
        conn: &mut C,
        batch: &[&Pending<'_, M>],
        body: &mut F,
        values: &mut Vec<T>,
    ) -> Attempt<E>
    where
        C: LoadConnection,
        C::Backend: InboxBackend,
        F: FnMut(&mut C, &M) -> Result<T, E>,
    {
        let mut deliveries: Vec<Delivery> = batch.iter().map(|p| Delivery::start(&p.key)).collect();
        let scope = match Scope::new::<C::Backend>(status(conn)) {
            Ok(scope) => scope,
            Err(error) => return Attempt::Trouble(0, E::from(error)),
        };
        let claims = match claim_all(conn, &scope, batch) {
            Ok(claims) => claims,
            Err(ClaimFailure::Refused(position, error)) => {
                return Attempt::Refused(position, error);
            }
            Err(ClaimFailure::Trouble(error)) => {
                return Attempt::Trouble(0, into_handler_error(error));
            }
        };
        for delivery in &mut deliveries {
            delivery.claimed();
        }
        let mut outcomes = Vec::with_capacity(batch.len());
        for (position, (pending, claim)) in batch.iter().zip(&claims).enumerate() {
            if *claim == Claim::Duplicate {
                outcomes.push((position, Outcome::Duplicate));
                continue;
            }
            let ran = {
                let _entered = deliveries[position].entered();
                panic::catch_unwind(AssertUnwindSafe(|| body(conn, pending.message)))
            };
            let failed = match ran {
                Ok(Ok(value)) => {
                    values.push(value);
                    outcomes.push((position, Outcome::Processed(())));
                    continue;
                }
                Ok(Err(error)) => Some(error),
                Err(panic) => {
                    if roll_back(conn, &scope).is_err() {
                        // The connection is lost: nothing more can run on
                        // it, and the panic matters more.
                        panic::resume_unwind(panic);
                    }
                    // Run alone, the message panics again (or not), and is
                    // counted as `run_idempotent` counts it.
                    drop(panic);
                    return Attempt::BodyFailed(position);
                }
            };
            let error = failed.expect("the body's error");
            if let Err(rollback_error) = roll_back(conn, &scope) {
                let error = report_after_failed_rollback(error, rollback_error)
                    .unwrap_or_else(into_handler_error);
                return Attempt::Trouble(position, error);
            }
            return if is_trouble(&error) {
                Attempt::Trouble(position, error)
            } else {
                Attempt::BodyFailed(position)
            };
        }
        if let Err(error) = commit(conn, &scope) {
            return Attempt::Trouble(
                claims
                    .iter()
                    .position(|claim| *claim == Claim::Claimed)
                    .unwrap_or(0),
                into_handler_error(error),
            );
        }
        for ((delivery, pending), claim) in deliveries.into_iter().zip(batch).zip(&claims) {
            let ending = match claim {
                Claim::Claimed => Ending::Processed,
                Claim::Duplicate => Ending::Duplicate,
            };
            delivery.finish(&pending.key, ending);
        }
        Attempt::Committed(outcomes)
    }
}

/// Why the claims of a batch were not made.
enum ClaimFailure {
    /// The database refused the id at this position (the level is rolled
    /// back).
    Refused(usize, InboxError),
    /// Database trouble (the level is rolled back, or lost).
    Trouble(InboxError),
}

/// Begins the batch's level and claims every id in it, retrying a claim
/// that lost a lock conflict (outermost level only), and claiming id by id
/// when the backend cannot tell which ids a statement inserted. Returns the
/// claims in batch order, with the level open.
fn claim_all<C, M>(
    conn: &mut C,
    scope: &Scope,
    batch: &[&Pending<'_, M>],
) -> Result<Vec<Claim>, ClaimFailure>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let mut tries = RetryPolicy::CLAIM.tries();
    let mut one_by_one = false;
    loop {
        begin(conn, scope).map_err(ClaimFailure::Trouble)?;
        let claimed = if one_by_one {
            claim_each(conn, batch)
        } else {
            claim_in_statements(conn, batch)
        };
        let error = match claimed {
            Ok(Some(claims)) => return Ok(claims),
            Ok(None) => None,
            Err(error) => Some(error),
        };
        if let Err(rollback_error) = roll_back(conn, scope) {
            let cause = error.map_or(
                InboxError::Database(diesel::result::Error::RollbackTransaction),
                |error| match error {
                    ClaimFailure::Refused(_, error) | ClaimFailure::Trouble(error) => error,
                },
            );
            return Err(ClaimFailure::Trouble(either(report_after_failed_rollback(
                cause,
                rollback_error,
            ))));
        }
        match error {
            // Mixed: claim them one by one.
            None => one_by_one = true,
            // A refused text: which id it was, only single claims tell.
            Some(ClaimFailure::Trouble(InboxError::Database(cause)))
                if !one_by_one && is_refused_key_text(&cause) =>
            {
                one_by_one = true;
            }
            Some(ClaimFailure::Trouble(InboxError::Database(cause)))
                if scope.is_outermost() && tries.again(&cause).is_some() => {}
            Some(failure) => return Err(failure),
        }
    }
}

/// The claims of `batch` in as few statements as the backend's parameter
/// limit allows, over the ids in sorted order; `None` when a statement
/// could not tell which ids it inserted.
fn claim_in_statements<C, M>(
    conn: &mut C,
    batch: &[&Pending<'_, M>],
) -> Result<Option<Vec<Claim>>, ClaimFailure>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    require_transaction(status(conn))
        .map_err(|error| ClaimFailure::Trouble(InboxError::Database(error)))?;
    let handler = batch[0].key.handler().as_str();
    let mut ids: Vec<&str> = batch.iter().map(|p| p.key.message_id()).collect();
    ids.sort_unstable();
    let mut inserted = HashSet::with_capacity(ids.len());
    for statement in ids.chunks(C::Backend::MAX_CLAIMS_PER_STATEMENT) {
        match C::Backend::claim_batch(conn, handler, statement) {
            Ok(BatchClaimed::Inserted(new)) => inserted.extend(new),
            Ok(BatchClaimed::Mixed) => return Ok(None),
            Err(error) => return Err(ClaimFailure::Trouble(InboxError::Database(error))),
        }
    }
    Ok(Some(
        batch
            .iter()
            .map(|p| match inserted.contains(p.key.message_id()) {
                true => Claim::Claimed,
                false => Claim::Duplicate,
            })
            .collect(),
    ))
}

/// The claims of `batch`, one statement per id, in sorted order.
fn claim_each<C, M>(
    conn: &mut C,
    batch: &[&Pending<'_, M>],
) -> Result<Option<Vec<Claim>>, ClaimFailure>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_unstable_by(|a, b| batch[*a].key.message_id().cmp(batch[*b].key.message_id()));
    let mut claims = vec![Claim::Duplicate; batch.len()];
    for position in order {
        claims[position] = match claim_or_refuse(conn, &batch[position].key) {
            Ok(claim) => claim,
            Err(error) if error.is_invalid_message() => {
                return Err(ClaimFailure::Refused(position, error));
            }
            Err(error) => return Err(ClaimFailure::Trouble(error)),
        };
    }
    Ok(Some(claims))
}

/// Whether a body's error is database trouble, which says nothing about the
/// message (a lost connection, a lock conflict): not counted, and the batch
/// stops.
fn is_trouble<E: HandlerError>(error: &E) -> bool {
    Failure::of_error(error).is_none() && !matches!(classify(error), Found::Final)
}

/// What to do about database trouble: the error's own recovery.
fn trouble_recovery<E: HandlerError>(error: &E) -> Recovery {
    match classify(error) {
        Found::Database(recovery) => recovery,
        _ => Recovery::Retry,
    }
}
