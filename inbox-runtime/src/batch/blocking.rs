//! The batch form on blocking Diesel connections.

use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};

use diesel::connection::LoadConnection;

use super::{
    Attempt, BatchReport, BodyFailure, ClaimFailure, ClaimMode, Execute, Pending, Run,
    attempt_after_body_failure, attempt_after_claims_failed, attempt_after_commit, claimed,
    claims_of, current, lost_after_claims, next_claim_mode, one_by_one_failure, sorted_ids,
    sorted_positions,
};
use crate::attempts::{MaxAttempts, default_max_attempts};
use crate::backend::{BatchClaimed, InboxBackend};
use crate::claim::Claim;
use crate::error::{HandlerError, InboxError};
use crate::execution::{RetryPolicy, block_ready, require_transaction};
use crate::key::HandlerName;
use crate::message_id::MessageId;
use crate::observe::Delivery;
use crate::outcome::Outcome;
use crate::scope::Scope;
use crate::transaction::{begin, claim_or_refuse, commit, roll_back, run_idempotent_with, status};

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
///   message's [`InboxError::InvalidMessageId`](crate::InboxError::InvalidMessageId); the others proceed.
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
/// - **A refused commit** on a connection that stays sound (a body ignored
///   a failed statement, so PostgreSQL cannot commit; a deferred constraint
///   on SQLite) belongs to one message without saying which: the batch is
///   halved, and halved again, until that message runs alone and gets the
///   single form's error; the others commit.
/// - **Database trouble** (a lost connection, a lock conflict in a body, a
///   commit that fails for either, or that loses the connection — a
///   deferred constraint failing PostgreSQL's `COMMIT` does): nothing of
///   that transaction commits. The message that met it gets the error, and
///   every message of the batch not committed yet gets
///   [`InboxError::BatchAborted`](crate::InboxError::BatchAborted)
///   (retryable, with the same [`Recovery`](crate::Recovery)); the run
///   stops there. A claim that loses a lock conflict is retried first, as
///   `run_idempotent` retries it. Duplicates keep `Ok(Outcome::Duplicate)`:
///   their ids were committed by other deliveries.
/// - **Size**: any number of messages. A transaction holds at most
///   [`MAX_BATCH_MESSAGES`](crate::MAX_BATCH_MESSAGES); a longer batch is run as several, in order.
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
/// instead of [`default_max_attempts`](crate::default_max_attempts).
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
    body: F,
) -> BatchReport<T, E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: FnMut(&mut C, &M) -> Result<T, E>,
{
    let mut exec = Blocking {
        conn,
        bodies: Each(body),
        max_attempts,
    };
    block_ready(Run::drive(&mut exec, handler, messages, id_of))
}
/// [`run_idempotent_batch`] with one body for all the new messages of a
/// transaction instead of one per message: what lets a batch write its
/// effects in one statement (one multi-row `INSERT` for a hundred ledger
/// rows), beyond what one transaction and one claim save.
///
/// `body` gets the messages whose ids were just claimed, in the order
/// given (duplicates, copies and invalid ids left out), and runs at most
/// once per transaction. When it fails (its error or a panic), the runtime
/// cannot tell which message it failed on: the batch is rolled back and
/// halved, and halved again, until the failing message runs alone, with
/// `body` called on it alone and the single form's rules (its attempt
/// counted, dead at the limit or on a rejection); the other halves commit.
/// A failure that is database trouble aborts the batch as
/// [`run_idempotent_batch`] does. Every other guarantee is
/// [`run_idempotent_batch`]'s.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use inbox_runtime::{HandlerName, run_idempotent_batch_bulk};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// conn.batch_execute("CREATE TABLE ledger (id TEXT PRIMARY KEY)")?;
/// let handler = HandlerName::new("billing.record")?;
/// let record = |conn: &mut SqliteConnection, ids: &[&&str]| {
///     let values: Vec<String> = ids.iter().map(|id| format!("('{id}')")).collect();
///     conn.batch_execute(&format!("INSERT INTO ledger VALUES {}", values.join(", ")))
/// };
/// let first = run_idempotent_batch_bulk(&mut conn, &handler, &["a", "b"], |id| *id, record);
/// assert_eq!(first.processed(), 2);
/// // "a" again: the body gets only "c".
/// let second = run_idempotent_batch_bulk(&mut conn, &handler, &["a", "c"], |id| *id, record);
/// assert_eq!((second.duplicates(), second.processed()), (1, 1));
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_batch_bulk<C, M, I, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    body: F,
) -> BatchReport<(), E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: FnMut(&mut C, &[&M]) -> Result<(), E>,
{
    let max_attempts = default_max_attempts();
    run_idempotent_batch_bulk_with(conn, handler, messages, id_of, max_attempts, body)
}

/// [`run_idempotent_batch_bulk`] with the handler's own limit of failed
/// attempts instead of [`default_max_attempts`](crate::default_max_attempts).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use inbox_runtime::{ack_decision, AckDecision, HandlerName, InboxError, MaxAttempts, run_idempotent_batch_bulk_with};
///
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::setup(&mut conn)?;
/// let handler = HandlerName::new("orders")?;
/// // Fails whenever "bad" is among the messages: halved until it is alone.
/// let body = |_: &mut SqliteConnection, ids: &[&&str]| match ids.contains(&&"bad") {
///     true => Err(InboxError::rejected("unknown sku")),
///     false => Ok(()),
/// };
/// let messages = ["a", "b", "bad", "c"];
/// let report = run_idempotent_batch_bulk_with(&mut conn, &handler, &messages, |id| *id, MaxAttempts::limit(3), body);
/// let decisions: Vec<_> = report.results().iter().map(ack_decision).collect();
/// assert_eq!(decisions, [AckDecision::Ack, AckDecision::Ack, AckDecision::DeadLetter, AckDecision::Ack]);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run_idempotent_batch_bulk_with<C, M, I, E, F>(
    conn: &mut C,
    handler: &HandlerName,
    messages: &[M],
    id_of: impl Fn(&M) -> &I,
    max_attempts: MaxAttempts,
    body: F,
) -> BatchReport<(), E>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    I: MessageId + ?Sized,
    E: HandlerError,
    F: FnMut(&mut C, &[&M]) -> Result<(), E>,
{
    let mut exec = Blocking {
        conn,
        bodies: Bulk(body),
        max_attempts,
    };
    block_ready(Run::drive(&mut exec, handler, messages, id_of))
}

/// A batch on a blocking connection: every step is done before its future
/// is first polled.
struct Blocking<'c, C, B> {
    conn: &'c mut C,
    bodies: B,
    max_attempts: MaxAttempts,
}

/// How a blocking batch runs the bodies of its messages.
trait Bodies<C, M, T, E> {
    /// Runs the bodies of the messages of `batch` whose ids were claimed
    /// (`claims`), in order, pushing their values: on failure, the position
    /// of the message it failed on, if it says (`None`: a bulk body), and
    /// the failure.
    fn run(
        &mut self,
        conn: &mut C,
        batch: &[&Pending<'_, M>],
        claims: &[Claim],
        deliveries: &[Delivery],
        values: &mut Vec<T>,
    ) -> Result<(), (Option<usize>, BodyFailure<E>)>;

    /// The body of one message on its own.
    fn one(&mut self, conn: &mut C, pending: &Pending<'_, M>) -> Result<T, E>;
}

/// A body per message.
struct Each<F>(F);

impl<C, M, T, E, F> Bodies<C, M, T, E> for Each<F>
where
    F: FnMut(&mut C, &M) -> Result<T, E>,
{
    fn run(
        &mut self,
        conn: &mut C,
        batch: &[&Pending<'_, M>],
        claims: &[Claim],
        deliveries: &[Delivery],
        values: &mut Vec<T>,
    ) -> Result<(), (Option<usize>, BodyFailure<E>)> {
        for (position, (pending, claim)) in batch.iter().zip(claims).enumerate() {
            if *claim == Claim::Duplicate {
                continue;
            }
            let _entered = deliveries[position].entered();
            let body = || current::running([&pending.key], || (self.0)(conn, pending.message));
            match panic::catch_unwind(AssertUnwindSafe(body)) {
                Ok(Ok(value)) => values.push(value),
                Ok(Err(error)) => return Err((Some(position), BodyFailure::Error(error))),
                Err(panic) => return Err((Some(position), BodyFailure::Panic(panic))),
            }
        }
        Ok(())
    }

    fn one(&mut self, conn: &mut C, pending: &Pending<'_, M>) -> Result<T, E> {
        current::running([&pending.key], || (self.0)(conn, pending.message))
    }
}

/// One body for all the messages claimed.
struct Bulk<F>(F);

impl<C, M, E, F> Bodies<C, M, (), E> for Bulk<F>
where
    F: FnMut(&mut C, &[&M]) -> Result<(), E>,
{
    fn run(
        &mut self,
        conn: &mut C,
        batch: &[&Pending<'_, M>],
        claims: &[Claim],
        _deliveries: &[Delivery],
        values: &mut Vec<()>,
    ) -> Result<(), (Option<usize>, BodyFailure<E>)> {
        let new = claimed(batch, claims);
        if new.is_empty() {
            return Ok(());
        }
        let messages: Vec<&M> = new.iter().map(|p| p.message).collect();
        let keys = new.iter().map(|p| &p.key);
        let body = || current::running(keys, || (self.0)(conn, &messages));
        match panic::catch_unwind(AssertUnwindSafe(body)) {
            Ok(Ok(())) => {
                values.extend(new.iter().map(|_| ()));
                Ok(())
            }
            Ok(Err(error)) => Err((None, BodyFailure::Error(error))),
            Err(panic) => Err((None, BodyFailure::Panic(panic))),
        }
    }

    fn one(&mut self, conn: &mut C, pending: &Pending<'_, M>) -> Result<(), E> {
        current::running([&pending.key], || (self.0)(conn, &[pending.message]))
    }
}

impl<C, M, T, E, B> Execute<M, T, E> for Blocking<'_, C, B>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
    E: HandlerError,
    B: Bodies<C, M, T, E>,
{
    async fn attempt(&mut self, batch: &[&Pending<'_, M>], values: &mut Vec<T>) -> Attempt<E> {
        self.attempt_now(batch, values)
    }

    fn is_broken(&mut self) -> bool {
        status(self.conn).transaction_depth().is_err()
    }

    async fn alone(&mut self, pending: &Pending<'_, M>) -> Result<Outcome<T>, E> {
        let bodies = &mut self.bodies;
        run_idempotent_with(self.conn, pending.key.clone(), self.max_attempts, |conn| {
            bodies.one(conn, pending).map(Outcome::Processed)
        })
    }
}

impl<C, B> Blocking<'_, C, B>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    fn attempt_now<M, T, E>(&mut self, batch: &[&Pending<'_, M>], values: &mut Vec<T>) -> Attempt<E>
    where
        E: HandlerError,
        B: Bodies<C, M, T, E>,
    {
        let conn = &mut *self.conn;
        let mut deliveries: Vec<Delivery> = batch.iter().map(|p| Delivery::start(&p.key)).collect();
        let scope = match Scope::new::<C::Backend>(status(conn)) {
            Ok(scope) => scope,
            Err(error) => return Attempt::Trouble(0, E::from(error), Vec::new()),
        };
        let claims = match claim_all(conn, &scope, batch) {
            Ok(claims) => claims,
            Err(failure) => return attempt_after_claims_failed(failure),
        };
        deliveries.iter_mut().for_each(Delivery::claimed);
        if let Err((at, failure)) = self.bodies.run(conn, batch, &claims, &deliveries, values) {
            let rolled_back = roll_back(conn, &scope);
            return attempt_after_body_failure(at, failure, rolled_back, &claims);
        }
        let committed = commit(conn, &scope);
        let broken = status(conn).transaction_depth().is_err();
        attempt_after_commit(committed, broken, deliveries, batch, claims)
    }
}

/// Begins the batch's level and claims every id in it (see
/// [`next_claim_mode`] for the tries). Returns the claims in batch order,
/// with the level open.
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
    let mut mode = ClaimMode::Statements;
    loop {
        begin(conn, scope).map_err(ClaimFailure::Trouble)?;
        let claimed = match mode {
            ClaimMode::Statements => claim_in_statements(conn, batch),
            ClaimMode::OneByOne => claim_each(conn, batch).map(Some),
        };
        let failure = match claimed {
            Ok(Some(claims)) => return Ok(claims),
            Ok(None) => None,
            Err(failure) => Some(failure),
        };
        if let Err(rollback_error) = roll_back(conn, scope) {
            return Err(lost_after_claims(failure, rollback_error));
        }
        mode = next_claim_mode(failure, mode, scope, &mut tries)?;
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
    let ids = sorted_ids(batch);
    let mut inserted = HashSet::with_capacity(ids.len());
    for statement in ids.chunks(C::Backend::MAX_CLAIMS_PER_STATEMENT) {
        match C::Backend::claim_batch(conn, handler, statement) {
            Ok(BatchClaimed::Inserted(new)) => inserted.extend(new),
            Ok(BatchClaimed::Mixed) => return Ok(None),
            Err(error) => return Err(ClaimFailure::Trouble(InboxError::Database(error))),
        }
    }
    Ok(Some(claims_of(batch, &inserted)))
}

/// The claims of `batch`, one statement per id, in sorted order.
fn claim_each<C, M>(conn: &mut C, batch: &[&Pending<'_, M>]) -> Result<Vec<Claim>, ClaimFailure>
where
    C: LoadConnection,
    C::Backend: InboxBackend,
{
    let mut claims = vec![Claim::Duplicate; batch.len()];
    for position in sorted_positions(batch) {
        claims[position] = claim_or_refuse(conn, &batch[position].key)
            .map_err(|error| one_by_one_failure(position, error))?;
    }
    Ok(claims)
}
